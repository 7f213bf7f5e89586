"""The docid syntax: which parts can live inside a docid (grtool.docid.triple_problem), `triples extract` rejecting the
others with their reason code, the index build's flips rendered from the stored parts (never by splitting the docid
text), and recall's parse of a stored docid, as written and tail-first, finding the stored triple again."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from llm_helpers import write_documents
from sample_helpers import write_stage
from index_helpers import write_triples_stage
from llm_helpers import FlakyServer, serve

from grtool.docid import (
    BRACKETS, DOCID_END, DOCID_START, SPECIAL, SYNTAX_REASONS, flip, flip_key, parse, render, triple_key, triple_problem,
)  # fmt: skip
from grtool.vocab.readers import DocidIndex
from grtool.index.base import Index
from grtool.index.build import build_index
from grtool.store.schemas import TRIPLES
from grtool.store.stage import read_table
from grtool.triples.parse import parse_line, parse_output

# (triple, reason): one of each kind a part cannot be.
BAD = [
    (("Paris", "  ", "France"), "empty_part"),
    (("Paris<docid_end>", "capital of", "France"), "docid_marker_in_part"),
    (("Paris", "capital of", "<docid_start>France"), "docid_marker_in_part"),
    (("[1] Paris", "capital of", "France"), "bracket_in_part"),
    (("Paris", "capital of", "France]"), "bracket_in_part"),
    (("Paris", "capital\nof", "France"), "control_char_in_part"),
    (("Paris", "capital of", "France\r"), "control_char_in_part"),
    (("Par\x00is", "capital of", "France"), "control_char_in_part"),
    (("Paris", "capital of", "Fra\x1bnce"), "control_char_in_part"),
    (("Paris", "capital\u2028of", "France"), "control_char_in_part"),
    ((", Paris", "capital of", "France"), "separator_in_part"),  # the docid reads "<start>, Paris, ...": empty head
    (("Paris", "capital of", "France,"), "separator_in_part"),  # the flip reads "France,, capital of, ...": empty part
    (("Paris", ", capital of", "France"), "separator_in_part"),
    (("Paris", "seat of", "Lamar County, , Texas"), "separator_in_part"),  # the flip's relation would be empty
]
# Parts that can: commas between text in any part, brackets-like and marker-like text that is neither.
GOOD = [
    ("Paris, Texas", "located in", "United States"),
    ("Ana, mon amour", "director", "Călin Peter Netzer"),
    ("Launch", "date", "July 31, 2012"),
    ("1,000 Islands", "located in", "Ontario, Canada"),
    ("f(x)", "less than", "<docid> 3"),
    ("Moza bint Nasser", "place of birth", "Al Khor"),
]


@pytest.mark.parametrize("triple, reason", BAD, ids=[f"{r}-{i}" for i, (_, r) in enumerate(BAD)])
def test_each_bad_part_has_its_reason_code(triple, reason):
    problem = triple_problem(triple)
    assert problem is not None and problem.reason == reason and reason in SYNTAX_REASONS
    assert problem.detail.split()[0] in ("head", "relation", "tail")


@pytest.mark.parametrize("triple", GOOD)
def test_a_good_triple_parses_back_to_its_key_in_both_syntaxes_and_orientations(triple):
    assert triple_problem(triple) is None
    for markers in (SPECIAL, BRACKETS):
        forward, tail_first = parse(render(triple, markers)), parse(render(flip(triple), markers))
        assert forward.docids == [triple_key(*triple)] and forward.malformed == 0
        assert tail_first.docids == [flip_key(*triple)] and tail_first.malformed == 0


@pytest.mark.parametrize("triple, reason", [b for b in BAD if b[1] != "control_char_in_part"])
def test_a_rejected_triple_would_not_parse_back(triple, reason):
    # Why the rule: in some syntax or orientation the docid is malformed or names another key. (Control characters
    # survive a parse; they break lines: the chains prompt lists one triple a line, a bracket citation is one line.)
    broken = []
    for markers in (SPECIAL, BRACKETS):
        for spelling, key in ((triple, triple_key(*triple)), (flip(triple), flip_key(*triple))):
            got = parse(render(spelling, markers))
            broken.append(got.docids != [key] or got.malformed > 0)
    assert any(broken)


def test_parse_output_rejects_each_kind_with_its_reason():
    output = json.dumps({"triples": [
        ["Paris", "capital of", "France"],
        ["Paris<docid_end>", "capital of", "France"],
        ["Paris", "capital of", "<docid_start>France"],
        ["Paris", "capital of", "France [1]"],
        ["Par\u0000is", "capital of", "France"],
        ["Paris", "capital\u000bof", "France"],
        ["Paris", "capital\u2029of", "France"],
        [", Paris", "capital of", "France"],
        ["Paris", "capital, , of", "France"],
        ["Paris", "", "France"],
        ["Paris", "twinned\nwith", "Rome"],  # a newline is whitespace to the parser: normalized, kept
        ["Paris, Texas", "located in", "United States"],  # commas between text: kept
        ["Paris", "capital of", "France"],  # a duplicate: merged, not rejected
    ]})  # fmt: skip
    parsed = parse_output(output)
    assert parsed.triples == [("Paris", "capital of", "France"), ("Paris", "twinned with", "Rome"), ("Paris, Texas", "located in", "United States")]
    assert [p.reason for _, p in parsed.rejected] == [
        "docid_marker_in_part", "docid_marker_in_part", "bracket_in_part", "control_char_in_part", "control_char_in_part",
        "control_char_in_part", "separator_in_part", "separator_in_part", "empty_part",
    ]  # fmt: skip
    assert parsed.candidates == len(parsed.triples) + len(parsed.rejected) + parsed.duplicates
    assert parsed.empty_parts == [("Paris", "", "France")]
    # Line shapes too: a citation number is read as part of the head, then rejected.
    assert parse_line("[1] Paris | capital of | France")[0].strip() == "[1] Paris"
    assert [p.reason for _, p in parse_output("[1] Paris | capital of | France").rejected] == ["bracket_in_part"]
    # A run's own markers are markers too.
    custom = parse_output('[["Paris", "capital of", "France <d>"]]', markers=("<d>", "</d>"))
    assert custom.triples == [] and [p.reason for _, p in custom.rejected] == ["docid_marker_in_part"]


def test_triples_extract_rejects_them_into_rejects_and_the_books_balance(tmp_path, cli):
    answers = {
        "Paris": json.dumps({"triples": [["Paris", "capital of", "France"], ["Paris [1]", "capital of", "France"], ["Paris", "capital of", "France"]]}),
        "Texas": json.dumps({"triples": [["Paris, Texas", "located in", "Texas"], ["Paris", "seat of\u0000", "Lamar County"], [", Paris", "in", "Texas"]]}),
        "Docs": json.dumps({"triples": [["Docids", "end with", "<docid_end>"], ["Docids", "marked by", "tokens <d>"]]}),
    }  # fmt: skip
    docs = [{"doc_id": f"d-{t.lower()}", "title": t, "text": f"Some text about {t}.", "datasets": ["test"]} for t in answers]
    documents = write_documents(tmp_path / "corpus" / "documents", docs)
    server = FlakyServer({t: (a, "stop") for t, a in answers.items()}, flaky=False)
    serve(server)
    out = tmp_path / "out"
    try:
        cli("triples", "extract", documents, "--out", out, "--backend", "openai", "--base-url", server.url, "--grounding", "off",
            "--docid-start", "<d>", "--docid-end", "</d>", "--max-empty-share", "0.5")  # fmt: skip
    finally:
        server.shutdown()
    kept = read_table(out / "triples").to_pylist()
    assert sorted((r["head"], r["docid"]) for r in kept) == [("Paris", "<d>Paris, capital of, France</d>"), ("Paris, Texas", "<d>Paris, Texas, located in, Texas</d>")]
    rejects = [json.loads(line) for line in (out / "triples" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
    assert sorted((r["reason"], r["record"]["head"]) for r in rejects) == [
        ("bracket_in_part", "Paris [1]"), ("control_char_in_part", "Paris"), ("docid_marker_in_part", "Docids"),
        ("docid_marker_in_part", "Docids"), ("separator_in_part", ", Paris"),
    ]  # fmt: skip
    assert all(r["detail"] for r in rejects)
    counters = json.loads((out / "triples" / "_manifest.json").read_text())["counters"]
    assert counters["in"] == 8 == counters["out"] + counters["merged"] + sum(counters["rejected"].values())
    assert counters["out"] == 2 and counters["merged"] == 1


def _row(doc_id: str, idx: int, h: str, r: str, t: str, docid: str | None = None) -> dict:
    return {"doc_id": doc_id, "idx": idx, "head": h, "relation": r, "tail": t, "docid": docid or SPECIAL.render(h, r, t)}


def test_index_flips_come_from_the_stored_parts(tmp_path):
    rows = [
        _row("tx", 0, "Paris, Texas", "located in", "United States"),  # a comma in the head
        _row("tx", 1, "Paris, Texas", "seat of", "Lamar County, Texas"),  # commas in head and tail
        _row("fr", 0, "Paris", "capital of", "France"),
    ]
    stage = write_triples_stage(tmp_path / "triples", rows)
    meta = build_index(stage, tmp_path / "idx", tokenizer="qwen", flips=True)
    table = pq.read_table(tmp_path / "idx" / "docids.parquet").to_pylist()
    flipped = sorted(r["docid"] for r in table if r["flipped"])
    assert flipped == sorted(SPECIAL.render(*flip((r["head"], r["relation"], r["tail"]))) for r in rows)
    assert f"{DOCID_START}United States, located in, Paris, Texas{DOCID_END}" in flipped
    assert f"{DOCID_START}located in, United States, Texas, Paris{DOCID_END}" not in flipped  # the text split at its first commas
    assert meta["sizes"]["flips_unsplit"] == 0 and meta["sizes"]["docids_skipped"] == 0
    index = Index.open(tmp_path / "idx")
    enc = index.tokenizer.encode
    assert index.resolve_docid(enc(f"{DOCID_START}Lamar County, Texas, seat of, Paris, Texas{DOCID_END}")) == (["tx"], True)
    assert index.resolve_docid(enc(rows[0]["docid"])) == (["tx"], False)


def test_index_build_skips_and_reports_docids_the_syntax_rejects(tmp_path, cli):
    rows = [
        _row("a", 0, "Paris", "capital of", "France"),
        _row("b", 0, "[1] Paris", "capital of", "France"),  # written before triples extract checked parts
        _row("b", 1, "Paris", "capital of", "France<docid_end>"),
        _row("b", 2, "Paris", "capital of", "France<docid_end>"),  # the same docid again: counted once
        _row("c", 0, "x", "y", "z", docid=f"{DOCID_START}tab\there{DOCID_END}"),  # not its parts: the text is checked
    ]
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    proc = cli("index", "build", "-", "--tokenizer", "qwen", "--out", tmp_path / "idx", "--flips", "--json", input=lines, env={"COLUMNS": "400"})
    report = json.loads(proc.stdout)
    assert report["docids_skipped"] == 3 and report["sequences"] == 2 and report["documents"] == 1
    err = " ".join(proc.stderr.split())
    assert "3 docids skipped" in err and "bracket_in_part 1, control_char_in_part 1, docid_marker_in_part 1" in err
    assert "<stdin>, row 2: '<docid_start>[1] Paris, capital of, France<docid_end>': head '[1] Paris' holds '['" in err
    stats = json.loads(cli("index", "stats", tmp_path / "idx", "--json").stdout)
    assert stats["docids_skipped"] == 3 and stats["flips_unsplit"] == 0
    # Nothing left to index is an input error naming the skipped ones.
    bad = "".join(json.dumps(r) + "\n" for r in rows[1:3])
    err = cli("index", "build", "-", "--tokenizer", "qwen", "--out", tmp_path / "none", input=bad, check=2, env={"COLUMNS": "400"}).stderr
    assert "no triples to index (2 docids skipped: bracket_in_part 1, docid_marker_in_part 1)" in " ".join(err.split())


def test_recall_finds_the_stored_triple_from_its_docid_either_way_round(tmp_path):
    rows = [{"doc_id": "tx", "idx": 0, "head": "Paris, Texas", "relation": "located in", "tail": "United States", "docid": ""},
            {"doc_id": "launch", "idx": 0, "head": "Launch", "relation": "date", "tail": "July 31, 2012", "docid": ""}]  # fmt: skip
    write_stage(tmp_path / "triples", "triples", TRIPLES, rows)
    index = DocidIndex.build(tmp_path / "triples")
    for row in rows:
        triple = (row["head"], row["relation"], row["tail"])
        for markers in (SPECIAL, BRACKETS):
            text = f"First {render(triple, markers)} then {render(flip(triple), markers)}."
            got = parse(text)
            assert got.malformed == 0 and got.docids == [triple_key(*triple), flip_key(*triple)]
            assert [index.resolve(k) for k in got.docids] == [({row["doc_id"]}, False), ({row["doc_id"]}, True)]


def test_chains_never_offer_a_triple_the_syntax_rejects(tmp_path):
    from grtool.chains.triples import TripleStore

    rows = [_row("a", 0, "Paris", "capital of", "France"), _row("a", 1, "Paris", "capital of", "France [1]"),
            _row("a", 2, "Paris, Texas", "named after", "Paris"), _row("b", 0, "<docid_start>x", "y", "z")]  # fmt: skip
    store = TripleStore(write_triples_stage(tmp_path / "triples", rows))
    offered = store.for_docs(["a", "b"])
    assert [(t.head, t.tail) for t in offered["a"]] == [("Paris", "France"), ("Paris, Texas", "Paris")] and "b" not in offered
    assert store.skipped == 2
    assert {t.head for t in store.distractor_pool(seed=1)} == {"Paris", "Paris, Texas"}
