"""`grtool eval answer`: SQuAD v1.1 exact match and token F1 on hand-checked cases, other readers' answers scored
from a file, and the embedded model reading the documents a BM25 run retrieved."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, run_cli
from grtool.evaluation.answers import best_scores, normalize_answer
from grtool.evaluation.reader import prediction_of, verdict_of

# (prediction, gold answers, EM, F1), each worked out by hand from SQuAD v1.1's rules
CASES = [
    ("the Eiffel Tower", ["Eiffel Tower"], 1, 1),  # an article is dropped
    ("Eiffel Tower.", ["eiffel tower"], 1, 1),  # punctuation and case
    ("An apple a day", ["apple day"], 1, 1),  # every article, as words
    ("theater", ["the theater"], 1, 1),  # "the" inside a word stays
    ("  Barack   Obama ", ["Barack Obama"], 1, 1),  # whitespace collapsed
    ("U.S.", ["US"], 1, 1),  # punctuation inside a word
    ("Paris, France", ["Paris"], 0, 2 / 3),  # P 1/2, R 1
    ("cat", ["cat cat"], 0, 2 / 3),  # tokens are a multiset: P 1, R 1/2
    ("rock and roll", ["Rock & Roll"], 0, 0.8),  # "&" goes, "and" stays: P 2/3, R 1
    ("well-known", ["well known"], 0, 0),  # a hyphen is removed, not a space
    ("NYC", ["New York City", "NYC"], 1, 1),  # an alias
    ("New York", ["New York City", "NYC"], 0, 0.8),  # the best over the answers: P 1, R 2/3
    ("", ["Paris"], 0, 0),  # an empty prediction
    ("the", ["a"], 1, 0),  # both normalise to nothing: equal, but no shared token (v1.1's rule)
]


@pytest.mark.parametrize(("prediction", "golds", "em", "f1"), CASES)
def test_squad_exact_match_and_f1(prediction, golds, em, f1):
    assert best_scores(prediction, golds) == (em, pytest.approx(f1))


def test_normalisation():
    assert normalize_answer("The  Quick, brown FOX!") == "quick brown fox"


def test_what_is_read_of_the_reader_and_the_judge():
    assert prediction_of("\n Answer: Dodoma\nIt is the capital.") == "Dodoma"
    assert prediction_of("") == ""
    assert [verdict_of(t) for t in ("Yes.", " no, it is not", "**yes**", "Maybe", "")] == [True, False, True, None, None]


@pytest.fixture(scope="module")
def generic_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("answers")
    run_cli("corpus", "ingest", EXAMPLES / "generic" / "questions_dev.jsonl", EXAMPLES / "generic" / "documents.jsonl", "--out", root / "corpus")
    return root


def test_answers_file_is_scored_against_answer_and_aliases(generic_corpus, tmp_path):
    lines = [
        {"qid": "lake-1", "answer": "the Silber river."},  # an alias, after normalisation: EM 1
        {"qid": "lake-2", "answer": "Ostwick on Sea"},  # alias "Ostwick-on-Sea" → "ostwickonsea"; answer "Ostwick": P 1/3, R 1
        {"qid": "lake-3", "answer": "no"},
        {"qid": "lake-1", "answer": "wrong"},  # repeated: the first counts
        {"qid": "nowhere", "answer": "x"},
    ]
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    report = json.loads(run_cli("eval", "answer", "--answers", path, "--corpus", generic_corpus / "corpus", "--json", "--per-question").stdout)
    assert report["scored"] == 3
    assert report["exact_match"] == pytest.approx(1 / 3)
    assert report["f1"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert report["not_scored"] == {"unknown_or_unanswerable_qid": 1, "examples": ["line 5: nowhere"], "repeated_qid": 1}
    assert [q["exact_match"] for q in report["questions"]] == [1, 0, 0]
    table = run_cli("eval", "answer", "--answers", path, "--corpus", generic_corpus / "corpus").stderr  # the log console
    assert "0.3333" in table and "0.5000" in table


def test_bad_answers_file_names_the_line(generic_corpus, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"qid": "lake-1", "answer": "Silber"}\n{"qid": "lake-2", "answer": 3}\n')
    proc = run_cli("eval", "answer", "--answers", path, "--corpus", generic_corpus / "corpus", check=2)
    assert "bad.jsonl, line 2: 'answer' must be a string, got int" in " ".join(proc.stderr.split())
    proc = run_cli("eval", "answer", "--corpus", generic_corpus / "corpus", check=2)
    assert "give RESPONSES" in proc.stderr


@pytest.mark.slow
def test_embedded_model_reads_the_bm25_documents_judges_and_resumes(tmp_path):
    pytest.importorskip("bm25s")
    hotpot = EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    run_cli("corpus", "ingest", hotpot, "--out", tmp_path / "corpus")
    run_cli("retrieve", tmp_path / "corpus", "--method", "bm25", "--limit", "2", "--out", tmp_path / "bm25")
    args = ["eval", "answer", tmp_path / "bm25", "--corpus", tmp_path / "corpus", "--out", tmp_path / "answers", "--json", "--per-question",
            "--judge", "SmolLM2-135M-Instruct"]  # fmt: skip
    report = json.loads(run_cli(*args).stdout)
    assert report["scored"] == 2 and len(report["questions"]) == 2
    from grtool.store.stage import read_table

    table = read_table(tmp_path / "answers").to_pylist()
    responses = {r["qid"]: r["doc_ids"] for r in read_table(tmp_path / "bm25").to_pylist()}
    for row, question in zip(sorted(table, key=lambda r: r["qid"]), sorted(report["questions"], key=lambda q: q["qid"])):
        assert row["text"].strip() and row["doc_ids"] == responses[row["qid"]] and row["model"]
        assert (row["exact_match"], row["f1"]) == best_scores(row["prediction"], row["answers"]) == (question["exact_match"], question["f1"])
        assert row["judge_model"] and row["judge_text"] is not None and row["judged_correct"] == verdict_of(row["judge_text"]) == question["judged_correct"]
    verdicts = [r["judged_correct"] for r in table if r["judged_correct"] is not None]
    assert report["judged"] == len(verdicts)
    assert report["judged_accuracy"] == (sum(verdicts) / len(verdicts) if verdicts else None)
    again = run_cli(*args)  # every part done: read back, nothing generated again
    assert json.loads(again.stdout) == report and "generating" not in again.stderr
