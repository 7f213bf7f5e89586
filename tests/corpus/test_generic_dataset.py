"""Bring your own data (#35): the generic layout (a questions file and a documents file) and the Hugging Face
layouts of 2WikiMultihopQA and MoreHopQA, through `corpus ingest`, then `validate`.

Expected doc ids are computed here from each document's own title and text (grtool's content hash), and the
expected gold lists from the ids and titles the question records give, in their order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO
from grtool.corpus.doc_hash import doc_id
from grtool.corpus.ingest import ingest
from grtool.errors import InputError
from grtool.store.empty import EmptyResult
from grtool.store.stage import read_table

from output_helpers import rows_by
from output_helpers import no_spaces


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _manifest(out: Path, table: str) -> dict:
    return json.loads((out / table / "_manifest.json").read_bytes())


def _rejects(out: Path, table: str) -> list[dict]:
    f = out / table / "_rejects" / "part-00000.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


DOCS = [
    {"id": "a", "title": "Alder Fen", "text": "Alder Fen is a wetland fed by the Cray brook."},
    {"id": "b", "title": "Cray brook", "text": "The Cray brook rises on Tollin Hill."},
    {"id": 7, "title": "Tollin Hill", "text": "Tollin Hill is 212 metres high."},
]


# ------------------------------------------------------------------------------------- generic layout


def test_bundled_generic_example_by_ids_and_by_titles(examples, cli, tmp_path):
    """Doc ids are grtool's hashes of each document's title and text; gold documents keep the given (hop)
    order, whether named by id or by title; the split comes from the record, else from the file name."""
    folder = examples / "generic"
    out = tmp_path / "out"
    proc = cli("corpus", "ingest", folder / "questions_dev.jsonl", folder / "documents.jsonl", "--dataset", "generic", "--out", out, "--json")
    report = json.loads(proc.stdout)
    assert report["rejected"] == {} and report["questions_by_dataset"] == {"generic": 3}
    assert {(e["path"], e["records"], e["by"]) for e in report["detected"]} == {
        (str(folder / "questions_dev.jsonl"), "questions", "--dataset"),
        (str(folder / "documents.jsonl"), "documents", "--dataset"),
    }
    cli("validate", out)

    given = _lines(folder / "documents.jsonl")
    hashes = {str(d["id"]): doc_id(d.get("title", ""), d["text"]) for d in given}
    by_title = {d["title"]: hashes[d["id"]] for d in given if d.get("title")}
    docs = rows_by(read_table(out / "documents"), "doc_id")
    assert set(docs) == set(hashes.values())
    assert all(docs[hashes[str(d["id"])]]["text"] == d["text"] and docs[hashes[str(d["id"])]]["datasets"] == ["generic"] for d in given)
    untitled = [d for d in given if "title" not in d]
    assert untitled and docs[hashes[untitled[0]["id"]]]["title"] == ""

    questions = rows_by(read_table(out / "questions"), "qid")
    records = _lines(folder / "questions_dev.jsonl")
    assert set(questions) == {r["qid"] for r in records}
    for r in records:
        q = questions[r["qid"]]
        expected = [hashes[i] for i in r["gold_doc_ids"]] if "gold_doc_ids" in r else [by_title[t] for t in r["gold_titles"]]
        assert q["gold_doc_ids"] == expected and len(expected) == 2
        assert q["split"] == r.get("split", "dev") and q["dataset"] == "generic" and q["answerable"]
        assert json.loads(q["meta"])["hops"] == 2
    listed = next(r for r in records if isinstance(r["answer"], list))
    assert questions[listed["qid"]]["answer"] == listed["answer"][0]
    assert questions[listed["qid"]]["answer_aliases"] == listed["answer"][1:]
    assert questions["lake-1"]["answer_aliases"] == ["Silber River"]
    assert json.loads(questions["lake-1"]["meta"])["gold_ids"] == ["d-observatory", "d-lake"]


def test_detected_without_dataset_in_any_order_and_split_option(tmp_path):
    """Questions with qid/question/answer and documents with id/text are recognised without --dataset, the
    questions file may come first, numeric ids match their string form, and --split overrides a record's split."""
    docs = _write(tmp_path / "docs.jsonl", DOCS)
    questions = _write(
        tmp_path / "my_questions.jsonl",
        [
            {"id": "q1", "question": "Where does the brook feeding Alder Fen rise?", "answer": "Tollin Hill", "gold_doc_ids": ["a", "b", 7], "split": "dev"},
            {"qid": "q2", "question": "How high is Tollin Hill?", "answer": "212 metres", "gold_doc_ids": ["7"]},
        ],
    )
    report = ingest([questions, docs], tmp_path / "auto")
    assert report.rejected == {} and report.questions == 2
    assert {(e["records"], e["dataset"], e["by"]) for e in report.detected} == {("questions", "generic", "detected"), ("documents", "generic", "detected")}
    q = rows_by(read_table(tmp_path / "auto" / "questions"), "qid")
    ids = {str(d["id"]): doc_id(d["title"], d["text"]) for d in DOCS}
    assert q["q1"]["gold_doc_ids"] == [ids["a"], ids["b"], ids["7"]] and q["q2"]["gold_doc_ids"] == [ids["7"]]
    assert q["q1"]["split"] == "dev" and q["q2"]["split"] == "unknown"  # no split field, none in the file name

    ingest([questions, docs], tmp_path / "test", split="test")
    assert {r["split"] for r in read_table(tmp_path / "test" / "questions").to_pylist()} == {"test"}


def test_missing_keys_are_rejects_naming_record_and_key_or_fatal_under_strict(cli, tmp_path):
    docs = _write(tmp_path / "docs.jsonl", [*DOCS, {"id": "c", "title": "No text"}, {"text": "Neither id nor title."}])
    questions = _write(
        tmp_path / "questions_train.jsonl",
        [
            {"qid": "ok", "question": "Where does the Cray brook rise?", "answer": "Tollin Hill", "gold_titles": ["Cray brook"]},
            {"qid": "no-answer", "question": "How high is Tollin Hill?", "gold_doc_ids": [7]},
            {"qid": "no-question", "answer": "x", "gold_doc_ids": ["a"]},
            {"question": "Which fen?", "answer": "Alder Fen"},
            {"qid": "both", "question": "q", "answer": "a", "gold_doc_ids": ["a"], "gold_titles": ["Alder Fen"]},
        ],
    )
    out = tmp_path / "out"
    cli("corpus", "ingest", questions, docs, "--dataset", "generic", "--out", out)
    cli("validate", out)
    q_man, d_man = _manifest(out, "questions"), _manifest(out, "documents")
    assert q_man["rows"] == 1 and q_man["counters"]["rejected"] == {
        "missing field 'answer'": 1,
        "missing field 'question'": 1,
        "missing field 'qid'": 1,
        "fields 'gold_doc_ids' and 'gold_titles' are both given": 1,
    }
    assert q_man["counters"]["in"] == 5  # rows in = out + rejected
    assert d_man["rows"] == 3 and d_man["counters"]["rejected"] == {"missing field 'text'": 1, "missing field 'id' or 'title'": 1}
    positions = {r["reason"]: (r["source"], r["position"]) for r in _rejects(out, "questions")}
    assert positions["missing field 'answer'"] == (str(questions), "line 2")
    assert positions["missing field 'qid'"] == (str(questions), "line 4")

    proc = cli("corpus", "ingest", questions, docs, "--dataset", "generic", "--strict", "--out", tmp_path / "s", check=2)
    assert no_spaces(f"{questions}, line 2 (qid 'no-answer'): missing field 'answer' [--strict]") in no_spaces(proc.stderr)
    assert not (tmp_path / "s").exists()


def test_unknown_or_ambiguous_gold_is_a_reject_with_the_reason(cli, tmp_path):
    docs = _write(
        tmp_path / "docs.jsonl", [*DOCS, {"id": "a2", "title": "Alder Fen", "text": "Another page of the same name."}, {"id": "a", "title": "Alder Fen", "text": "A different text under a used id."}]
    )
    questions = _write(
        tmp_path / "questions_dev.jsonl",
        [
            {"qid": "good", "question": "q", "answer": "a", "gold_doc_ids": ["a", "b"]},
            {"qid": "lost-id", "question": "q", "answer": "a", "gold_doc_ids": ["a", "zz"]},
            {"qid": "lost-title", "question": "q", "answer": "a", "gold_titles": ["Nowhere"]},
            {"qid": "two-fens", "question": "q", "answer": "a", "gold_titles": ["Alder Fen"]},
        ],
    )
    out = tmp_path / "out"
    report = ingest([docs, questions], out, allow_rejects=True)  # an ambiguous title stops the run without it
    assert report.questions == 1 and report.rejected == {
        "questions: unknown gold document id": 1,
        "questions: unknown gold title": 1,
        "questions: ambiguous gold title": 1,
        "documents: duplicate document id": 1,
    }
    rejects = {r["record"]["qid"]: r for r in _rejects(out, "questions")}
    assert rejects["lost-id"]["position"] == "line 2" and "'zz'" in rejects["lost-id"]["detail"]
    assert "'Nowhere'" in rejects["lost-title"]["detail"]
    assert "2 different documents" in rejects["two-fens"]["detail"]
    (dup,) = _rejects(out, "documents")
    assert dup["position"] == "line 5" and dup["record"]["text"].startswith("A different text")
    cli("validate", out)

    proc = cli("corpus", "ingest", docs, questions, "--strict", "--out", tmp_path / "strict", check=2)
    assert no_spaces(f"{docs}, line 5: duplicate document id") in no_spaces(proc.stderr)
    proc = cli("corpus", "ingest", _write(tmp_path / "d2.jsonl", DOCS), questions, "--strict", "--out", tmp_path / "strict", check=2)
    assert no_spaces(f"{questions}, line 2 (qid 'lost-id'): unknown gold document id ('zz' is not the id") in no_spaces(proc.stderr)

    # the questions without their documents file: every named gold document is unknown, and the reason says why
    with pytest.raises(EmptyResult, match="all 4 input rows were rejected: 'unknown gold document id' ×2, 'unknown gold title' ×2"):
        ingest([questions], tmp_path / "refused")  # an empty result is an error naming the reasons, unless allowed
    report = ingest([questions], tmp_path / "alone", allow_empty=True)  # what --allow-empty sets
    assert report.questions == 0 and sum(report.rejected.values()) == 4
    assert all("no generic documents file was read" in r["detail"] for r in _rejects(tmp_path / "alone", "questions"))


def test_titled_documents_need_dataset_and_generic_refuses_release_files(examples, tmp_path):
    titled = _write(tmp_path / "corpus.jsonl", [{"title": d["title"], "text": d["text"]} for d in DOCS])
    questions = _write(tmp_path / "questions_dev.jsonl", [{"qid": "t", "question": "q", "answer": "a", "gold_titles": ["Tollin Hill", "Cray brook"]}])
    with pytest.raises(InputError, match=r"pass --dataset hotpotqa\|2wikimultihopqa\|musique\|morehopqa\|generic"):
        ingest([questions, titled], tmp_path / "o1")
    ingest([questions, titled], tmp_path / "o2", dataset="generic")
    (q,) = read_table(tmp_path / "o2" / "questions").to_pylist()
    assert q["gold_doc_ids"] == [doc_id(DOCS[2]["title"], DOCS[2]["text"]), doc_id(DOCS[1]["title"], DOCS[1]["text"])]
    with pytest.raises(InputError, match="these are HotpotQA questions, not generic"):
        ingest([examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"], tmp_path / "o3", dataset="generic")
    # a corpus file whose documents carry ids may still be named as one dataset's
    report = ingest([_write(tmp_path / "ids.jsonl", DOCS)], tmp_path / "o4", dataset="musique")
    assert report.documents == 3 and report.detected[0]["dataset"] == "musique"


def test_unknown_schema_names_the_generic_layout_and_its_page(cli, tmp_path):
    odd = _write(tmp_path / "mine.jsonl", [{"qid": "1", "question": "q", "gold_doc_ids": ["a"]}])  # no answer
    proc = cli("corpus", "ingest", odd, "--out", tmp_path / "o", check=2)
    message = no_spaces(proc.stderr)
    assert no_spaces(f"{odd}, line 1: unknown schema (keys ['gold_doc_ids', 'qid', 'question'])") in message
    assert (
        no_spaces(
            "the generic layout (questions with qid, question, answer and gold_doc_ids or gold_titles; "
            "documents with id or title, and text) or the inline layout (question, answer, paragraphs: [{title, "
            "text, is_supporting}]), described in docs/data-formats.md (or pass --dataset"
        )
        in message
    )
    assert (REPO / "docs" / "data-formats.md").is_file()


# ---------------------------------------------------------------------------------- Hugging Face layouts


def test_hf_2wikimultihopqa_layout(examples, tmp_path):
    """context {title, content}, supporting_facts {title, sent_id}, evidences {fact, relation, entity}: the same
    documents as the release layout, gold in supporting-fact order."""
    hf = examples / "2wikimultihopqa" / "2wikimultihopqa_hf_validation.example.jsonl"
    release = examples / "2wikimultihopqa" / "dev.example.json"
    report = ingest([hf, release], tmp_path / "out")
    assert report.rejected == {} and report.detected[0]["dataset"] == "2wikimultihopqa"
    (rec,) = _lines(hf)
    docs = rows_by(read_table(tmp_path / "out" / "documents"), "doc_id")
    q = rows_by(read_table(tmp_path / "out" / "questions"), "qid")[rec["_id"]]
    context = dict(zip(rec["context"]["title"], rec["context"]["content"]))
    assert q["gold_doc_ids"] == [doc_id(t, " ".join(context[t])) for t in rec["supporting_facts"]["title"]]
    assert all(d in docs for d in q["gold_doc_ids"]) and q["split"] == "dev"
    meta = json.loads(q["meta"])
    assert meta["layout"] == "hf" and meta["hops"] == 2
    assert meta["supporting_facts"] == [list(p) for p in zip(rec["supporting_facts"]["title"], rec["supporting_facts"]["sent_id"])]
    # the paragraphs both layouts carry are one document each
    release_titles = {t for r in json.loads(release.read_text()) for t, _ in r["context"]}
    shared = set(context) & release_titles
    assert shared and all(len([d for d in docs.values() if d["title"] == t]) == 1 for t in shared)


def test_hf_morehopqa_layout(examples, tmp_path):
    """context {title, paragraphs}, question_decomposition as parallel lists and no `_id`: the qid is made from
    the question text; gold documents follow the decomposition."""
    hf = examples / "morehopqa" / "morehopqa_hf_verified.example.jsonl"
    out = tmp_path / "out"
    report = ingest([hf], out)
    assert report.rejected == {} and report.questions_by_dataset == {"morehopqa": 1}
    (rec,) = _lines(hf)
    (q,) = read_table(out / "questions").to_pylist()
    assert q["qid"].startswith("q-") and q["split"] == "test" and q["answer"] == rec["answer"]
    context = dict(zip(rec["context"]["title"], rec["context"]["paragraphs"]))
    hop_titles = [t for t in rec["question_decomposition"]["paragraph_support_title"] if t]
    assert q["gold_doc_ids"] == [doc_id(t, " ".join(context[t])) for t in hop_titles]
    meta = json.loads(q["meta"])
    assert meta["layout"] == "hf" and meta["qid_from"] == "question" and meta["hops"] == 3
    again = ingest([hf], tmp_path / "again")  # the made-up qid is stable
    assert read_table(tmp_path / "again" / "questions").to_pylist()[0]["qid"] == q["qid"] and again.questions == 1

    broken = dict(rec, context={"title": ["A", "B"], "paragraphs": [["x"]]})
    bad = _write(tmp_path / "morehopqa_bad.jsonl", [rec, broken])
    report = ingest([bad], tmp_path / "bad")
    assert report.rejected == {"questions: field 'context' has the wrong type": 1}
