"""`grtool chains gold`: chains written from gold triples by rule (no model), taken by the filters and the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.chains.docids import Triple
from grtool.chains.gold import NoChain, Step, choose_steps, write_chain
from grtool.store.records import load_manifest
from grtool.store.stage import read_table
from grtool.triples.evidence import question_evidences, write_evidence_stage
from chains_helpers import TWO_WIKI


@pytest.fixture
def run(cli, tmp_path: Path) -> Path:
    """The tests' own 2Wiki records ingested, with their evidence triples as the triples stage."""
    cli("-q", "corpus", "ingest", TWO_WIKI, "--out", tmp_path / "corpus")
    assert write_evidence_stage(tmp_path / "corpus", tmp_path / "triples") > 0
    return tmp_path


def test_gold_chains_cite_the_evidences_in_order_and_pass_the_filters(cli, run: Path) -> None:
    corpus, triples, chains = run / "corpus", run / "triples", run / "chains"
    summary = json.loads(cli("-q", "chains", "gold", corpus, "--triples", triples, "--out", chains, "--json").stdout)
    questions = {q["qid"]: q for q in read_table(corpus / "questions").to_pylist()}
    rows = read_table(chains).to_pylist()
    assert summary["questions"] == len(questions) == summary["questions_chained"] + sum(summary["rejected"].values())
    # every question's gold documents hold an evidence (a subject matches a title with a qualifier too, `Star Wars` ->
    # `Star Wars (film)`), so none is rejected; questions = chained + rejected holds either way
    assert summary["rows"] == len(rows) >= 10 and summary["rejected"] == {}
    manifest = load_manifest(chains)
    assert manifest.params["model"] == "gold" and manifest.counters.in_ == len(questions)
    stored = {r["docid"] for r in read_table(triples).to_pylist()}
    for r in rows:
        q = questions[r["qid"]]
        assert (r["model"], r["candidate"], r["selected"]) == ("gold", 0, True)
        assert r["docids"] == [f"<docid_start>{h}, {rel}, {t}<docid_end>" for h, rel, t in question_evidences(q["meta"])]
        assert set(r["docids"]) <= stored and not any(r["flipped"])  # 2Wiki's hops read head-first
        assert r["text"].startswith("I look up the ") and r["text"].endswith(f"So the answer is {q['answer']}.")
    assert not (chains / "_rejects" / "part-00000.jsonl").exists()

    # the filters keep every one of them, and the export takes them as it takes a model's chains
    cli("-q", "filters", "apply", chains, "--corpus", corpus, "--triples", triples, "--out", run / "filtered")
    assert sum(r["selected"] for r in read_table(run / "filtered").to_pylist()) == len(rows)
    out = json.loads(cli("-q", "export", "sft", run / "filtered", "--corpus", corpus, "--out", "-", "--format", "trl-messages").stdout.splitlines()[0])
    assert out["messages"][-1]["content"] in {r["text"] for r in rows}

    # a second run resumes (nothing to do); another --flip is a different run, refused without --overwrite
    again = json.loads(cli("-q", "chains", "gold", corpus, "--triples", triples, "--out", chains, "--json").stdout)
    assert again["rows"] == len(rows)
    assert "flip" in cli("-q", "chains", "gold", corpus, "--triples", triples, "--out", chains, "--flip", "always", check=False).stderr


def test_flip_always_writes_every_docid_tail_first(cli, run: Path) -> None:
    cli("-q", "chains", "gold", run / "corpus", "--triples", run / "triples", "--out", run / "chains", "--flip", "always")
    rows = read_table(run / "chains").to_pylist()
    assert rows and all(all(r["flipped"]) and r["text"].startswith("I look up the ") for r in rows)  # from the known head
    cli("-q", "filters", "apply", run / "chains", "--corpus", run / "corpus", "--triples", run / "triples", "--out", run / "filtered")
    assert sum(r["selected"] for r in read_table(run / "filtered").to_pylist()) == len(rows)  # flips name stored triples


def test_a_wrong_flip_is_refused_before_anything_is_written(cli, tmp_path: Path) -> None:
    proc = cli("chains", "gold", tmp_path / "corpus", "--triples", tmp_path / "triples", "--out", tmp_path / "out", "--flip", "sometimes", check=2)
    assert "--flip" in proc.stderr and not (tmp_path / "out").exists()


def T(doc: str, i: int, head: str, relation: str, tail: str) -> Triple:
    return Triple(doc, i, head, relation, tail)


def test_without_evidences_each_gold_document_gives_its_connecting_triple() -> None:
    """HotpotQA-like: no dataset triples; per gold document in hop order, the triple linking the known to the answer."""
    by_doc = {
        "d1": [T("d1", 0, "Scott Derrickson", "occupation", "filmmaker"), T("d1", 1, "Sinister", "directed by", "Scott Derrickson")],
        "d2": [T("d2", 0, "Scott Derrickson", "born in", "Denver"), T("d2", 1, "Denver", "capital of", "Colorado")],
    }
    steps = choose_steps("Where was the director of Sinister born?", "Denver", ["d1", "d2"], by_doc)
    assert [(s.triple.idx, s.flipped) for s in steps] == [(1, False), (0, False)]
    # read from known to unknown: the tail is in the question, the head is not
    by_doc["d1"] = [T("d1", 0, "Scott Derrickson", "director of", "Sinister")]
    steps = choose_steps("Where was the director of Sinister born?", "Denver", ["d1", "d2"], by_doc)
    assert [(s.triple.doc_id, s.flipped) for s in steps] == [("d1", True), ("d2", False)]
    text, docids, flipped = write_chain(steps, "Denver")
    assert text == ("I look up what has Sinister as director of. <docid_start>Sinister, director of, Scott Derrickson<docid_end> "
                    "I look up the born in of Scott Derrickson. <docid_start>Scott Derrickson, born in, Denver<docid_end> "
                    "So the answer is Denver.")  # fmt: skip
    assert docids[0] == "<docid_start>Sinister, director of, Scott Derrickson<docid_end>" and flipped == [True, False]
    with pytest.raises(NoChain, match="no connecting triple"):
        choose_steps("Where was the director of Sinister born?", "Denver", ["d1", "d3"], {**by_doc, "d3": [T("d3", 0, "Moon", "orbits", "Earth")]})
    with pytest.raises(NoChain, match="gold documents without triples"):
        choose_steps("Q?", "A", ["d1", "d9"], by_doc)
    assert isinstance(steps[0], Step)


def test_the_evidence_stage_keeps_the_extra_rows_of_distractor_paragraphs(run: Path) -> None:
    """bench/quality.py --index-triples all adds extracted triples of paragraphs that are gold for no question."""
    gold = {d for q in read_table(run / "corpus" / "questions").to_pylist() for d in q["gold_doc_ids"] or ()}
    distractor = next(d["doc_id"] for d in read_table(run / "corpus" / "documents").to_pylist() if d["doc_id"] not in gold)
    extra = {"doc_id": distractor, "idx": 0, "head": "Some place", "relation": "located in", "tail": "Some country",
             "docid": "<docid_start>Some place, located in, Some country<docid_end>"}  # fmt: skip
    n = write_evidence_stage(run / "corpus", run / "triples-all", extra=[extra])
    rows = read_table(run / "triples-all").to_pylist()
    assert n == len(rows) == read_table(run / "triples").num_rows + 1
    assert rows[-1] == extra and rows[:-1] == read_table(run / "triples").to_pylist()
    counters = load_manifest(run / "triples-all").counters  # evidences read + the extra row = rows + merged + rejected
    assert counters.in_ == n + counters.merged + sum(counters.rejected.values())
