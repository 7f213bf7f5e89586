"""`eval recall --per-question` and `eval compare` of `retrieve` directories, on the samples corpus, values by hand.

The responses directories are written the way `grtool retrieve` writes them (its row function
:func:`grtool.retrieve.stage.response_row`, a `responses` stage whose manifest records the selection and the
questions and triples stages), with hand-written texts in place of a model's, so every recall is known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sample_helpers import write_stage
from sample_helpers import MOTHER_NOTHING, MUSIQUE, Q_MARA, Q_TIN, Q_MOTHER, Q_BELLS, SPECIAL, WIKI

from grtool.vocab.readers import DocidIndex
from grtool.llm.base import Generation
from grtool.retrieve.stage import RetrieveSettings, response_row
from grtool.store.schemas import RESPONSES
from grtool.store.stage import read_table
from grtool.store.records import resolve_stage

M, Z = "Oskar Venn Alder", "Liva Marren"  # Q_MOTHER's gold titles
MOTHER_EXACT = f"{SPECIAL(M, 'mother', Z)} {SPECIAL(Z, 'place of birth', 'Sorvik')} Sorvik."  # recall 1, exact
MOTHER_FLIPPED_HALLUCINATED = f"{SPECIAL('Sorvik', 'place of birth', Z)} {SPECIAL(Z, 'mother of', 'Oskar Venn')}"  # 0.5
MOTHER_COLLIDING = f"{SPECIAL('Aurel Venn Alder', 'second wife', Z)} {SPECIAL(Z, 'place of birth', 'Sorvik')}"  # 1, not exact
MOTHER_NON_GOLD = SPECIAL("Tobin Venn Alder", "date of birth", "23 July 1986")  # 0: Tobin is not gold
MARA_EXACT = f"{SPECIAL('Doru Petru Vlaicu', 'director', 'Mara, my harbour')} {SPECIAL('Doru Petru Vlaicu', 'place of birth', 'Sălcioara')}"
MARA_HALF = SPECIAL("Mara, my harbour", "director", "Doru Petru Vlaicu")  # 0.5
TIN_HALF = SPECIAL("Harbor of Tin (film)", "stars", "Nela Quist")  # 0.5
BELLS_ONE_OF_FOUR = SPECIAL("Three Bells at Noon", "director", "Hedda von Koralin")  # 0.25

# Two runs on the same four questions: per question (a, b) recall, and who wins.
RUN_A = [(Q_MOTHER, MOTHER_EXACT), (Q_MARA, MARA_EXACT), (Q_TIN, TIN_HALF), (Q_BELLS, MOTHER_NOTHING), (Q_MOTHER, MOTHER_FLIPPED_HALLUCINATED)]
RUN_B = [(Q_MOTHER, MOTHER_COLLIDING), (Q_MARA, MARA_HALF), (Q_TIN, TIN_HALF), (Q_BELLS, BELLS_ONE_OF_FOUR), (Q_MOTHER, MOTHER_NON_GOLD)]
# a: MOTHER (1 + 0.5) / 2 = 0.75, MARA 1, TIN 0.5, BELLS 0; b: MOTHER (1 + 0) / 2 = 0.5, MARA 0.5, TIN 0.5, BELLS 0.25
# b against a: better BELLS; worse MOTHER, MARA; same TIN.


def write_responses_dir(path: Path, corpus: Path, answers: list[tuple[str, str]], params: dict | None = None) -> Path:
    """A `retrieve` output directory holding ``answers`` (a qid's second answer is its sample 1)."""
    questions = resolve_stage(corpus, "questions")
    by_qid = {q["qid"]: q for q in read_table(questions).to_pylist()}
    lookup, settings = DocidIndex.build(corpus / "triples"), RetrieveSettings(markers="special")
    rows, samples_of = [], {}
    for qid, text in answers:
        sample = samples_of[qid] = samples_of.get(qid, -1) + 1
        row, _ = response_row(by_qid[qid], sample, Generation(text, "stop", completion_tokens=1, latency_ms=1.0), lookup, settings, "by hand")
        rows.append(row)
    params = {**settings.params(), "datasets": [], "splits": [], "limit": None, **(params or {})}  # as `retrieve` records them
    write_stage(path, "responses", RESPONSES, rows, params, inputs=[str(questions), str(corpus / "triples")])
    return path


def strict_json(text: str):
    """JSON as the standard reads it: NaN or Infinity would be an error, not a number."""
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON output"))


def scorable_qids(corpus: Path) -> set[str]:
    return {q["qid"] for q in read_table(corpus / "questions").to_pylist()
            if q["gold_doc_ids"] and q["answerable"] is not False and "gold_titles_missing" not in json.loads(q["meta"])}  # fmt: skip


@pytest.fixture(scope="module")
def runs(samples, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    corpus = samples["root"]
    return {"a": write_responses_dir(root / "a", corpus, RUN_A), "b": write_responses_dir(root / "b", corpus, RUN_B)}


def test_per_question_json_hand_checked(cli, samples, runs):
    corpus = samples["root"]
    proc = cli("eval", "recall", runs["a"], "--corpus", corpus, "--triples", corpus / "triples", "--per-question", "--json")
    report = strict_json(proc.stdout)
    by_qid = {q["qid"]: q for q in report["questions"]}
    mother = by_qid[Q_MOTHER]
    assert (mother["dataset"], mother["split"], mother["question"]) == (WIKI, "dev", samples["question"][Q_MOTHER])
    assert (mother["status"], mother["responses"], mother["recall"], mother["exact"]) == ("scored", 2, 0.75, 0.5)
    assert (mother["docids"], mother["hallucinated"]) == (4, 1)
    assert {g["title"] for g in mother["gold"]} == {M, Z}
    exact, flipped = mother["rows"]
    assert (exact["recall"], exact["exact"], exact["hallucinated"]) == (1.0, True, [])
    assert [(d["docid"], d["verdict"]) for d in exact["docids"]] == [(f"{M},mother,{Z}", "gold"), (f"{Z},place of birth,Sorvik", "gold")]
    assert sorted((d["title"], d["verdict"]) for d in exact["retrieved"]) == [(Z, "gold"), (M, "gold")]  # by title
    assert [(d["verdict"], d["flipped"]) for d in flipped["docids"]] == [("gold", True), ("hallucinated", False)]
    assert flipped["hallucinated"] == [f"{Z},mother of,Oskar Venn"] and flipped["recall"] == 0.5
    assert [d["title"] for d in flipped["retrieved"]] == [Z]
    tin = by_qid[Q_TIN]
    assert (tin["dataset"], tin["recall"], tin["exact"]) == (MUSIQUE, 0.5, 0.0)
    assert by_qid[Q_BELLS]["recall"] == 0.0 and by_qid[Q_BELLS]["rows"][0]["docids"] == []
    # every scorable question of the corpus was selected (no --split/--dataset/--limit): the rest have no row
    missing = scorable_qids(corpus) - {Q_MOTHER, Q_MARA, Q_TIN, Q_BELLS}
    assert report["selected"] == len(read_table(corpus / "questions")) and report["without_response"] == len(missing) > 0
    assert {q["qid"] for q in report["questions"] if q["status"] == "no_response"} == missing
    assert all(q["recall"] is None and q["rows"] == [] for q in report["questions"] if q["status"] == "no_response")
    assert (report["questions_scored"], report["responses"]) == (4, 5)
    # without the flag the report has no list, and the same figures
    plain = strict_json(cli("eval", "recall", runs["a"], "--corpus", corpus, "--triples", corpus / "triples", "--json").stdout)
    assert "questions" not in plain and plain["recall"] == report["recall"] == pytest.approx((1 + 1 + 0.5 + 0 + 0.5) / 5)


def test_non_gold_and_colliding_verdicts(cli, samples, runs):
    corpus = samples["root"]
    report = strict_json(cli("eval", "recall", runs["b"], "--corpus", corpus, "--triples", corpus / "triples", "--per-question", "--json").stdout)
    mother = next(q for q in report["questions"] if q["qid"] == Q_MOTHER)
    colliding, non_gold = mother["rows"]
    # the colliding triple is held by M (gold), Tobin and Emil: a gold verdict, three documents retrieved
    assert [d["verdict"] for d in colliding["docids"]] == ["gold", "gold"] and len(colliding["docids"][0]["documents"]) == 3
    assert (colliding["recall"], colliding["exact"]) == (1.0, False)
    assert sorted(d["verdict"] for d in colliding["retrieved"]) == ["gold", "gold", "non-gold", "non-gold"]
    assert [d["verdict"] for d in non_gold["docids"]] == ["non-gold"] and non_gold["recall"] == 0.0
    assert [(d["title"], d["verdict"]) for d in non_gold["retrieved"]] == [("Tobin Venn Alder", "non-gold")]


def test_per_question_table_on_the_terminal(cli, samples, runs):
    corpus = samples["root"]
    proc = cli("eval", "recall", runs["a"], "--corpus", corpus, "--triples", corpus / "triples", "--per-question", env={"COLUMNS": "400"})
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    mother = next(line for line in lines if Q_MOTHER in line)
    assert "0.750" in mother and f"✓ {M}" in mother and f"✓ {Z}" in mother
    assert "no response row" in proc.stderr and "without a response:" in proc.stderr


def test_selection_with_limit_from_the_manifest(cli, samples, tmp_path):
    """--dataset musique --limit 2 as retrieve records them: the first two MuSiQue questions were asked."""
    corpus = samples["root"]
    first_two = [q["qid"] for q in read_table(corpus / "questions").to_pylist() if q["dataset"] == MUSIQUE][:2]
    out = write_responses_dir(tmp_path / "r", corpus, [(first_two[0], TIN_HALF)], {"datasets": [MUSIQUE], "limit": 2})
    report = strict_json(cli("eval", "recall", out, "--corpus", corpus, "--triples", corpus / "triples", "--json").stdout)
    assert report["selected"] == 2
    assert report["without_response"] == (1 if first_two[1] in scorable_qids(corpus) else 0)


def test_compare_response_directories(cli, samples, runs, tmp_path):
    md = tmp_path / "cmp.md"
    proc = cli("eval", "compare", f"a={runs['a']}", f"b={runs['b']}", "--per-question", "--json", "--out", md)
    result = strict_json(proc.stdout)
    wins = result["per_question"]["b"]
    assert (wins["baseline"], wins["better"], wins["worse"], wins["same"], wins["questions"]) == ("a", 1, 2, 1, 4)
    assert {(c["qid"], c["baseline"], c["recall"]) for c in wins["changed"]} == {(Q_BELLS, 0.0, 0.25), (Q_MOTHER, 0.75, 0.5), (Q_MARA, 1.0, 0.5)}
    assert result["metrics"]["a"]["questions_scored"] == 4 and result["metrics"]["a"]["hallucinated"] == 1
    assert result["metrics"]["b"]["exact_match_share"] == 0.0 and result["metrics"]["a"]["exact_match_share"] == pytest.approx(2 / 5)
    assert result["recall"]["all"] == {"a": pytest.approx(3 / 5), "b": pytest.approx(2.25 / 5)}
    lines = md.read_text().splitlines()
    assert any(line.startswith("| b | 1 | 2 | 1 | 4 | ") for line in lines)  # then Δ recall, its interval and p
    assert f"| {Q_BELLS} | {WIKI} | 0.0000 | 0.2500 |" in lines
    assert "| hallucinated docids | 1/7 (0.143) | 0/6 (0.000) |" in lines
    # the other way round: b as the baseline
    other = strict_json(cli("eval", "compare", f"a={runs['a']}", f"b={runs['b']}", "--baseline", "b", "--json").stdout)
    assert {k: other["per_question"]["a"][k] for k in ("better", "worse", "same")} == {"better": 2, "worse": 1, "same": 1}
    # a directory beside a report of `eval recall --per-question --json`: the same wins
    corpus = samples["root"]
    report = tmp_path / "a.json"
    report.write_text(cli("eval", "recall", runs["a"], "--corpus", corpus, "--triples", corpus / "triples", "--per-question", "--json").stdout)
    mixed = strict_json(cli("eval", "compare", f"a={report}", f"b={runs['b']}", "--json").stdout)
    keys = ("baseline", "questions", "better", "worse", "same", "significance")
    assert {k: mixed["per_question"]["b"][k] for k in keys} == {k: wins[k] for k in keys}


def test_compare_refuses_different_questions_and_duplicate_labels(cli, samples, runs, tmp_path):
    fewer = write_responses_dir(tmp_path / "fewer", samples["root"], RUN_B[:2])
    proc = cli("eval", "compare", f"a={runs['a']}", f"fewer={fewer}", check=2)
    assert "different questions" in proc.stderr and "2 only in 'a'" in " ".join(proc.stderr.split())
    allowed = strict_json(cli("eval", "compare", f"a={runs['a']}", f"fewer={fewer}", "--allow-different-questions", "--json").stdout)
    assert allowed["per_question"]["fewer"]["questions"] == 2  # counted on the questions both scored
    proc = cli("eval", "compare", f"x={runs['a']}", f"x={runs['b']}", check=2)
    assert "label 'x' is given twice" in proc.stderr


def test_a_selection_the_corpus_cannot_make_is_said_not_fatal(cli, samples, tmp_path):
    """A run that answered train questions, scored against a corpus without them: recall as ever, the missing
    rows unknown (null) and a warning that says why."""
    corpus = samples["root"]
    out = write_responses_dir(tmp_path / "r", corpus, [(Q_MARA, MARA_EXACT)], {"splits": ["train"]})
    proc = cli("eval", "recall", out, "--corpus", corpus, "--triples", corpus / "triples", "--json")
    report = strict_json(proc.stdout)
    assert report["recall"] == 1.0 and report["selected"] is None and report["without_response"] is None
    assert "cannot select the questions it was asked" in " ".join(proc.stderr.split())


def test_a_damaged_selection_in_the_manifest_exits_2(cli, samples, tmp_path):
    corpus = samples["root"]
    out = write_responses_dir(tmp_path / "r", corpus, [(Q_MARA, MARA_EXACT)], {"limit": 2})
    manifest = json.loads((out / "_manifest.json").read_text())
    manifest["params"]["limit"] = "two"
    (out / "_manifest.json").write_text(json.dumps(manifest))
    proc = cli("eval", "recall", out, "--corpus", corpus, "--triples", corpus / "triples", check=2)
    assert "datasets / splits / limit are not what `retrieve` writes" in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr


def test_the_per_question_table_shows_control_characters_escaped(capsys):
    # before: a title's ESC went to the terminal raw (it recoloured everything after it)
    from grtool.cli.evaluate import print_per_question

    question = {"qid": "q\x1b[1m1", "dataset": "generic", "split": "dev", "recall": 1.0, "exact": 1.0, "docids": 1, "hallucinated": 0, "status": "scored",
                "rows": [{"retrieved": [{"doc_id": "d1", "title": "Per\x1b[31mson 0", "verdict": "gold"}]}]}  # fmt: skip
    print_per_question([question])
    printed = capsys.readouterr()
    text = printed.out + printed.err
    assert "\x1b[31m" not in text and "\x1b[1m1" not in text and "Per\\x1b[31mson 0" in text, text
