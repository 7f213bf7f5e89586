"""`grtool eval recall` on the samples corpus (our own 2WikiMultihopQA and MuSiQue records), with hand-checked values.

The corpus is the `grtool corpus ingest` of the samples, with the triples of ``sample_helpers.build_samples``
(2Wiki evidence triples and hand-read triples, among them one three-document collision).
"""

from __future__ import annotations

import json

import pytest
from sample_helpers import (
    MARA_BRACKETS,
    MARA_FLIPPED_EXACT,
    TIN_HALF,
    MOTHER_COLLIDING,
    MOTHER_EXACT,
    MOTHER_FLIPPED_AND_HALLUCINATED,
    MOTHER_MALFORMED,
    MUSIQUE,
    Q_MARA,
    Q_TIN,
    Q_MOTHER,
    WIKI,
    write_responses,
)

from grtool.docid import normalize as normalize_docid
from grtool.docid import parse as parse_docids
from grtool.vocab.readers import DocidIndex, QuestionIndex, Response
from grtool.evaluation.recall import score_response

SCORED = [
    (Q_MOTHER, MOTHER_EXACT),  # recall 1, docs {M, Z}
    (Q_MOTHER, MOTHER_COLLIDING),  # recall 1, docs {M, Tobin, Emil, Z}
    (Q_MOTHER, MOTHER_FLIPPED_AND_HALLUCINATED),  # recall 0.5, docs {Z}, 1 flipped, 1 hallucinated
    (Q_MOTHER, MOTHER_MALFORMED),  # recall 0.5, docs {M}, 3 malformed
    (Q_MARA, MARA_BRACKETS),  # recall 0.5, docs {A}
    (Q_MARA, MARA_FLIPPED_EXACT),  # recall 1, docs {A, C}, 1 flipped
    (Q_TIN, TIN_HALF),  # MuSiQue: recall 0.5, docs {Harbor of Tin (film)}
    ("no-such-question", MOTHER_EXACT),  # not scored, reported
]


def flat(text: str) -> str:
    """stderr with Rich's line wrapping undone."""
    return " ".join(text.split())


def test_recall_report_hand_checked(cli, samples, tmp_path):
    responses = write_responses(tmp_path / "samples.jsonl", SCORED)
    root = samples["root"]
    report = json.loads(cli("eval", "recall", responses, "--corpus", root, "--triples", root / "triples", "--json").stdout)
    # 2Wiki: (1 + 1 + 0.5 + 0.5 + 0.5 + 1) / 6 = 0.75; MuSiQue: 0.5; overall: 5 / 7.
    assert report["recall"] == pytest.approx(5 / 7)
    assert report["per_dataset"][WIKI]["recall"] == pytest.approx(0.75)
    assert report["per_dataset"][MUSIQUE]["recall"] == pytest.approx(0.5)
    assert report["responses"] == 7 and report["per_dataset"][WIKI]["responses"] == 6
    # Documents per response: 2 + 4 + 1 + 1 + 1 + 2 (+ 1 for MuSiQue) = 12 over 7.
    assert report["docs_per_response"] == pytest.approx(12 / 7)
    assert report["per_dataset"][WIKI]["docs_per_response"] == pytest.approx(11 / 6)
    # Well-formed docids: 2 + 2 + 2 + 1 + 1 + 2 + 1 = 11, one of them hallucinated.
    assert (report["docids"], report["hallucinated"]) == (11, 1)
    assert report["hallucinated_share"] == pytest.approx(1 / 11)
    assert report["malformed"] == 3 and report["responses_with_malformed"] == 1
    assert report["flipped"] == 2
    assert report["exact_match_share"] == pytest.approx(2 / 7)
    assert report["unknown_qid"] == 1 and report["no_gold"] == 0


def test_collisions_retrieve_every_holder(samples):
    index = DocidIndex.build(samples["root"] / "triples")
    docs, flipped = index.resolve(normalize_docid("Aurel Venn Alder, second wife, Liva Marren"))
    titles = {"Oskar Venn Alder", "Tobin Venn Alder", "Emil Venn Alder"}
    assert docs == {samples["doc"][t] for t in titles} and not flipped
    questions = QuestionIndex.build(samples["root"])
    score = score_response(Response(1, Q_MOTHER, MOTHER_COLLIDING), questions.get(Q_MOTHER), index)
    assert score.recall == 1.0 and not score.exact and len(score.retrieved) == 4


def test_flipped_docids_with_commas_in_the_parts(samples):
    index = DocidIndex.build(samples["root"] / "triples")
    mara = samples["doc"]["Mara, my harbour"]
    # Written forward with a comma in the head, and tail-first with the comma-holding head last.
    assert index.resolve(normalize_docid("Mara, my harbour, director, Doru Petru Vlaicu")) == ({mara}, False)
    assert index.resolve(normalize_docid("Doru Petru Vlaicu, director, Mara, my harbour")) == ({mara}, True)
    # A comma inside the tail ("March 4, 1961"), with sloppy spacing around the commas.
    liva = samples["doc"]["Liva Marren"]
    assert index.resolve(normalize_docid("Liva Marren ,date of birth,  March 4 , 1961")) == ({liva}, False)
    # Case is part of the docid.
    assert index.resolve(normalize_docid("liva marren, place of birth, sorvik")) == (frozenset(), False)


@pytest.mark.parametrize(
    "text, docids, malformed",
    [
        ("[Liva Marren, place of birth, Sorvik] and <docid_start>A, b, c<docid_end>", ["A,b,c", "Liva Marren,place of birth,Sorvik"], 0),
        ("<docid_start><docid_end> []", [], 2),  # empty markers
        ("<docid_start>Liva Marren, place of birth, Sorvik", [], 1),  # cut off before the end marker
        ("Sorvik<docid_end> [Liva]", [], 2),  # end without start; a bracket that is not a triple
        ("[a, b, [c, d, e]]", ["c,d,e"], 2),  # nested: the outer pair is broken
        ("<docid_start>x, y <docid_start>p, q, r<docid_end>", ["p,q,r"], 1),  # opened twice
        ("plain text with no docids", [], 0),
    ],
)
def test_parse_docids_counts_malformed_markers(text, docids, malformed):
    parsed = parse_docids(text)
    assert sorted(parsed.docids) == sorted(docids)
    assert parsed.malformed == malformed


def test_parse_reads_only_the_syntax_the_response_was_decoded_with():
    text = "<docid_start>A, b, c<docid_end> thinking [p, q, r] and [x] <docid_start><docid_end>"
    assert (sorted(parse_docids(text).docids), parse_docids(text).malformed) == (["A,b,c", "p,q,r"], 2)
    assert (parse_docids(text, "special").docids, parse_docids(text, "special").malformed) == (["A,b,c"], 1)
    assert (parse_docids(text, "brackets").docids, parse_docids(text, "brackets").malformed) == (["p,q,r"], 1)


def test_retrieve_rows_are_scored_in_their_own_syntax(cli, samples):
    """A `retrieve --markers special` row: a bracket the model wrote in its free text is thought, not a retrieval
    (the decoder constrains the marker spans only), so it is neither a document nor a hallucination."""
    row = {"qid": Q_MOTHER, "text": MOTHER_EXACT + " [Liva Marren, is a, who, lives there]"}
    read = {}
    for markers in (None, "special"):
        line = json.dumps({**row, **({"markers": markers} if markers else {})}) + "\n"
        read[markers] = json.loads(cli("eval", "recall", "-", "--corpus", samples["root"], "--triples", samples["root"], "--json", input=line).stdout)
    assert (read[None]["docids"], read[None]["hallucinated"]) == (3, 1)
    assert (read["special"]["docids"], read["special"]["hallucinated"], read["special"]["recall"]) == (2, 0, 1.0)


def test_bad_jsonl_line_names_file_and_line(cli, samples, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"qid": Q_MOTHER, "response": MOTHER_EXACT}) + "\n\n" + '{"qid": "x", "response": \n')
    proc = cli("eval", "recall", bad, "--corpus", samples["root"], "--triples", samples["root"], check=2)
    assert "bad.jsonl, line 3, character 26: not valid JSON" in flat(proc.stderr) and "Traceback" not in proc.stderr
    missing = tmp_path / "missing.jsonl"
    missing.write_text(json.dumps({"qid": Q_MOTHER, "answer": "no response field"}) + "\n")
    proc = cli("eval", "recall", missing, "--corpus", samples["root"], "--triples", samples["root"], check=2)
    assert "missing.jsonl, line 1: 'response' must be a string" in flat(proc.stderr)


def test_stdin_and_table_output(cli, samples):
    lines = "".join(json.dumps({"qid": q, "response": r}) + "\n" for q, r in SCORED)
    proc = cli("eval", "recall", "-", "--corpus", samples["root"], "--triples", samples["root"], input=lines)
    assert proc.stdout == ""  # the table goes to stderr
    assert "0.7143" in proc.stderr and "1 responses with an unknown qid" in flat(proc.stderr)


def test_nothing_scorable_exits_1(cli, samples, tmp_path):
    only_unknown = write_responses(tmp_path / "u.jsonl", [("nope", MOTHER_EXACT)])
    proc = cli("eval", "recall", only_unknown, "--corpus", samples["root"], "--triples", samples["root"], check=1)
    assert "no response could be scored" in flat(proc.stderr)


def test_stored_and_written_whitespace_meet(tmp_path):
    # Whatever whitespace a stored triple or a written docid carries (tabs, NBSP, ideographic space,
    # spaces around commas), both are reduced to the same key.
    from sample_helpers import write_stage

    from grtool.store.schemas import TRIPLES

    rows = [{"doc_id": "d1", "idx": 0, "head": "Liva\u00a0Marren ", "relation": " place of\u3000birth", "tail": "Sorvik,\u2029Vennmark\u3000", "docid": ""}]
    write_stage(tmp_path / "triples", "triples", TRIPLES, rows)
    index = DocidIndex.build(tmp_path / "triples")
    assert index.resolve(normalize_docid("Liva Marren , place of birth,  Sorvik , Vennmark")) == ({"d1"}, False)
    assert index.resolve(normalize_docid("Sorvik, Vennmark, place of birth, Liva Marren")) == ({"d1"}, True)


def test_questions_with_incomplete_gold_are_reported_not_scored(cli, examples, tmp_path):
    """A fullwiki question whose gold paragraph is missing from its context would score wrongly: skipped."""
    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter, read_table

    cli("corpus", "ingest", examples / "hotpotqa" / "hotpot_dev_fullwiki_v1.example.json", "--out", tmp_path / "run")
    questions = read_table(tmp_path / "run" / "questions").to_pylist()
    incomplete = {q["qid"] for q in questions if "gold_titles_missing" in json.loads(q["meta"])}
    assert incomplete and len(incomplete) < len(questions)
    docs = read_table(tmp_path / "run" / "documents").to_pylist()
    writer = StageWriter(tmp_path / "run" / "triples", StageSpec("triples", TRIPLES), num_parts=1)
    with writer.shard(0) as shard:
        rows = [{"doc_id": d["doc_id"], "idx": 0, "head": d["title"], "relation": "is", "tail": "a page",
                 "docid": f"<docid_start>{d['title']}, is, a page<docid_end>"} for d in docs]  # fmt: skip
        shard.count_in(len(rows))
        shard.write_rows(rows)
    writer.finish()
    title = {d["doc_id"]: d["title"] for d in docs}
    lines = [{"qid": q["qid"], "response": "".join(f"<docid_start>{title[g]}, is, a page<docid_end>" for g in q["gold_doc_ids"])}
             for q in questions]  # fmt: skip
    responses = tmp_path / "responses.jsonl"
    responses.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = json.loads(cli("eval", "recall", responses, "--corpus", tmp_path / "run", "--triples", tmp_path / "run", "--json").stdout)
    no_gold = sum(not q["gold_doc_ids"] for q in questions)
    assert report["incomplete_gold"] == len(incomplete) - sum(not q["gold_doc_ids"] for q in questions if q["qid"] in incomplete)
    assert report["responses"] == len(questions) - no_gold - report["incomplete_gold"]
    assert report["recall"] == 1.0  # what is scored is scored right
    overlap = json.loads(cli("corpus", "overlap", tmp_path / "run", "--json").stdout)
    assert overlap["left_out"]["gold_incomplete"] == report["incomplete_gold"]


def test_a_trec_file_is_never_written_with_an_id_that_holds_whitespace(tmp_path):
    # before: the qid "q 1" made a line of seven fields (exit 0), which `eval recall --run` then refused
    from grtool.errors import InputError
    from grtool.evaluation.trec import TrecWriter

    writer = TrecWriter("run\tname")
    writer.runs, writer.gold = {"q 1": ["d1"]}, {"q 1": ("d1",)}
    with pytest.raises(InputError, match=r"the id 'q 1' \(question 'q 1'\) holds whitespace"):
        writer.write(tmp_path / "run.trec", tmp_path / "qrels")
    assert not (tmp_path / "run.trec").exists() and writer.tag == "run_name"


def test_a_response_s_qid_is_read_as_ingest_reads_it_and_a_repeated_key_is_refused(cli, samples, tmp_path):
    """A qid past 64 bits kept digit for digit and 7.0 read as "7", as ingest reads them (before: "1.2345678901234568e+22",
    an unknown question with exit 0); a blank qid and a key given twice are refused, naming the line."""
    from grtool.vocab.readers import iter_responses

    path = tmp_path / "r.jsonl"
    path.write_text('{"qid": 12345678901234567890123, "response": ""}\n{"qid": 7.0, "response": ""}\n')
    assert [r.qid for r in iter_responses(path)] == ["12345678901234567890123", "7"]
    for line, words in [('{"qid": " ", "response": ""}', "line 2: field 'qid' is blank"),
                        ('{"qid": "q", "response": "nothing", "response": "x"}', "line 2: key 'response' is given twice")]:  # fmt: skip
        path.write_text(json.dumps({"qid": Q_MOTHER, "response": MOTHER_EXACT}) + "\n" + line + "\n")
        err = flat(cli("eval", "recall", path, "--corpus", samples["root"], "--triples", samples["root"], check=2).stderr)
        assert f"r.jsonl, {words}" in err, err
