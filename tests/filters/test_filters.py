"""`grtool filters apply` on 2WikiMultihopQA records (the tests' own, tests/data): their `evidences` are triples of the gold documents.

The corpus comes from the real `grtool corpus ingest`; the triples stage is written from the evidences (each
evidence belongs to the gold paragraph it is about) plus one plain triple per distractor paragraph; chains are
written by hand in the shape `chains synthesize` stores (docids between the special markers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grtool.vocab.text import Markers, conclusion, contains_answer, normalize_answer, parse_markers, says_cannot_answer
from grtool.store.empty import allowing
from grtool.store.io import InputTable
from grtool.store.schemas import CHAINS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, iter_rows
from grtool.store.records import load_manifest
from chains_helpers import TWO_WIKI
from conftest import EXAMPLES, TEST_DATA

S, E = "<docid_start>", "<docid_end>"


def docid(h: str, r: str, t: str, markers: tuple[str, str] = (S, E)) -> str:
    return f"{markers[0]}{h}, {r}, {t}{markers[1]}"


def write_stage(path, table, schema, rows, parts=1, params=None, by=None):
    """Rows dealt round-robin over the parts, or by the key ``by`` (all candidates of a qid in one part, as
    `chains synthesize` writes them)."""
    stage = StageWriter(path, StageSpec(table, schema, params=params or {}), num_parts=parts)
    keys = list(dict.fromkeys(r[by] for r in rows)) if by else None
    for p in range(parts):
        with stage.shard(p) as sh:
            chunk = rows[p::parts] if by is None else [r for r in rows if keys.index(r[by]) % parts == p]
            sh.count_in(len(chunk))
            sh.write_rows(chunk)
    with allowing(True):  # a test may want an empty stage
        stage.finish()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Corpus (real ingest), triples from the evidences, and questions with their evidence triples."""
    from conftest import run_cli

    root = tmp_path_factory.mktemp("filters")
    corpus = root / "corpus"
    run_cli("corpus", "ingest", TWO_WIKI, "--out", corpus)
    questions = list(InputTable.open(corpus, "questions").iter_rows())
    documents = {d["doc_id"]: d for d in InputTable.open(corpus, "documents").iter_rows()}
    triples, per_doc, facts = [], {}, {}

    def add(doc_id, h, r, t):
        idx = per_doc.setdefault(doc_id, 0)
        per_doc[doc_id] += 1
        triples.append({"doc_id": doc_id, "idx": idx, "head": h, "relation": r, "tail": t, "docid": docid(h, r, t)})

    for q in questions:
        evidences = json.loads(q["meta"])["evidences"]
        gold = q["gold_doc_ids"]
        by_title = {documents[g]["title"].casefold(): g for g in gold}
        facts[q["qid"]] = []
        for i, (h, r, t) in enumerate(evidences):
            doc = by_title.get(h.casefold(), gold[min(i, len(gold) - 1)])
            add(doc, h, r, t)
            facts[q["qid"]].append((h, r, t, doc))
    gold_all = {g for q in questions for g in q["gold_doc_ids"]}
    for doc_id, d in documents.items():
        if doc_id not in gold_all:
            add(doc_id, d["title"], "is the subject of", "a Wikipedia paragraph")
    write_stage(root / "triples", "triples", TRIPLES, triples, parts=2)
    return {"root": root, "corpus": corpus, "triples": root / "triples", "questions": {q["qid"]: q for q in questions}, "facts": facts, "documents": documents}


def good_text(q: dict, facts: list[tuple], flip: set[int] = frozenset(), markers=(S, E)) -> tuple[str, list[str], list[bool]]:
    """A chain in the recipe's shape: one sentence per retrieval, then 'So the answer is X.'"""
    sentences, docids, flipped = [], [], []
    for i, (h, r, t, _) in enumerate(facts):
        d = docid(t, r, h, markers) if i in flip else docid(h, r, t, markers)
        lead = "The question names" if i == 0 else "From there,"
        sentences.append(f"{lead} {h if i not in flip else t}, and {d} tells us more.")
        docids.append(d)
        flipped.append(i in flip)
    return " ".join(sentences) + f" So the answer is {q['answer']}.", docids, flipped


def chain_row(qid, text, docids, flipped=None, candidate=0, selected=True):
    return {
        "qid": qid,
        "candidate": candidate,
        "text": text,
        "docids": docids,
        "flipped": flipped or [False] * len(docids),
        "selected": selected,
        "score": 0.5,
        "model": "hand-written",
        "temperature": 0.0,
        "finish_reason": "stop",
    }


def run(cli, world, name, rows, *args, check=True, triples=None, params=None):
    chains = world["root"] / f"{name}-chains"
    out = world["root"] / f"{name}-out"
    write_stage(chains, "chains", CHAINS, rows, parts=2 if len(rows) > 3 else 1, params=params, by="qid")
    triples = triples or world["triples"]
    # --allow-empty: these hand-made chains are often all rejected, and the reasons are what is tested here
    proc = cli("filters", "apply", chains, "--corpus", world["corpus"], "--triples", triples, "--out", out, "--json", "--allow-empty", *args, check=check)
    report = json.loads(proc.stdout) if proc.returncode == 0 else None
    kept = {(r["qid"], r["candidate"]): r for r in iter_rows(out)} if out.exists() else {}
    rejects = {}
    for f in sorted((out / "_rejects").glob("*.jsonl")) if out.exists() else []:
        for line in f.read_text().splitlines():
            entry = json.loads(line)
            rejects[(entry["record"]["qid"], entry["record"]["candidate"])] = entry
    return report, kept, rejects, out


def test_good_and_flipped_chains_are_kept_unchanged(cli, world):
    rows = []
    for qid, facts in world["facts"].items():
        q = world["questions"][qid]
        rows.append(chain_row(qid, *good_text(q, facts)))
        rows.append(chain_row(qid, *good_text(q, facts, flip={len(facts) - 1}), candidate=1))
    report, kept, rejects, out = run(cli, world, "good", rows, "--all-candidates")
    assert rejects == {}, [e["detail"] for e in rejects.values()][:3]
    assert len(kept) == len(rows) == 2 * len(world["facts"])
    for row in rows:  # unchanged, field by field
        assert kept[(row["qid"], row["candidate"])] == row
    assert report["chains"] == report["kept"] == len(rows) and report["pass_rate"] == 1.0
    assert report["datasets"]["2wikimultihopqa"]["kept"] == len(rows)
    manifest = load_manifest(out)
    assert manifest.counters.in_ == manifest.counters.out == len(rows)
    cli("validate", out)


def test_bad_chains_are_rejected_with_every_reason(cli, world, tmp_path):
    qid = next(q for q, f in world["facts"].items() if len(f) == 2 and world["questions"][q]["type"] == "compositional")
    q, facts = world["questions"][qid], world["facts"][qid]
    (h0, r0, t0, _), (h1, r1, t1, _) = facts
    text, docids, _ = good_text(q, facts)
    hallucinated = docid(h1, "place of death", "Atlantis")
    gold_of_any = {g for other in world["questions"].values() for g in other["gold_doc_ids"]}
    distractor_doc = next(d for d in world["documents"].values() if d["doc_id"] not in gold_of_any)  # holds the "subject" triple
    outside = docid(distractor_doc["title"], "is the subject of", "a Wikipedia paragraph")
    cases = {
        "good": (text, docids),
        "missing": (text.replace(docids[1], hallucinated), [docids[0], hallucinated]),
        "repeat": (text.replace(" So the", f" Again {docids[1]} says so. So the"), [docids[0], docids[1], docids[1]]),
        "repeat-flipped": (text.replace(" So the", f" Read backwards {docid(t1, r1, h1)}. So the"), [docids[0], docids[1], docid(t1, r1, h1)]),
        "wrong-answer": (text.replace(f"answer is {q['answer']}", "answer is Doha"), docids),
        "cannot": (text.replace(f"So the answer is {q['answer']}.", "The retrieved triples are not enough to answer the question."), docids),
        "half-gold": (f"Only {docids[0]}. So the answer is {q['answer']}.", [docids[0]]),
        "non-gold": (text.replace(" So the", f" Also {outside}. So the"), [*docids, outside]),
        "unbalanced": (text.replace(E, "", 1), docids),
        "nested": (text.replace(S, S + S, 1), docids),
        "empty-part": (text.replace(docids[0], f"{S}{h0}, , {t0}{E}"), [f"{S}{h0}, , {t0}{E}", docids[1]]),
        "no-docid": (f"So the answer is {q['answer']}.", []),
        "column-differs": (text, [docids[1], docids[0]]),
    }
    rows = [chain_row(qid, t, d, candidate=i) for i, (t, d) in enumerate(cases.values())]
    rows.append(chain_row("no-such-question", text, docids, candidate=0))
    rows.append(chain_row(qid, text, docids, candidate=99, selected=False))  # judged too; passes, but 0 is kept
    report, kept, rejects, out = run(cli, world, "bad", rows, "--report", tmp_path / "r.md")
    names = list(cases)
    reasons = {names[k[1]] if k[0] == qid else k[0]: e["record"]["reasons"] for k, e in rejects.items()}
    assert set(kept) == {(qid, 0), (qid, 99)} and kept[(qid, 0)]["selected"] and not kept[(qid, 99)]["selected"]
    assert reasons["missing"] == ["docid-exists-missing", "gold-unknown-docid"]
    assert reasons["repeat"] == ["redundant"]
    assert reasons["repeat-flipped"] == ["redundant"]
    assert reasons["wrong-answer"] == ["answer-wrong"]
    assert reasons["cannot"] == ["answer-cannot-answer"]
    assert reasons["half-gold"] == ["gold-recall"]
    assert reasons["non-gold"] == ["gold-outside"]
    assert reasons["unbalanced"][0] == "format-markers" and reasons["nested"][0] == "format-markers"
    assert reasons["empty-part"] == ["format-empty-part", "docid-exists-missing", "gold-unknown-docid"]
    assert reasons["no-docid"] == ["format-no-docid", "gold-recall"]
    assert reasons["column-differs"] == ["format-docids-column"]
    assert reasons["no-such-question"] == ["unknown-qid"]
    assert rejects[(qid, 1)]["reason"] == "docid-exists-missing" and "Atlantis" in rejects[(qid, 1)]["detail"]

    assert report["chains"] == len(cases) + 2 and report["passed"] == 2 and report["kept"] == 1
    assert report["questions"] == 2 and report["questions_kept"] == 1 and report["yield"] == 0.5
    assert report["lost"]["question"] == 1 and sum(report["lost"].values()) == 1
    assert report["rules"]["format"] == 5 and report["rules"]["question"] == 1 and report["rules"]["redundant"] == 2
    assert report["reasons"]["redundant"] == 2 and len(report["examples"]["redundant"]) == 2
    assert all(1 <= len(v) <= 2 for v in report["examples"].values())
    md = (tmp_path / "r.md").read_text()
    assert "# Chain filter report" in md and "| 2wikimultihopqa |" in md and "### `answer-wrong`" in md and "Doha" in md
    counters = load_manifest(out).counters
    assert counters.in_ == counters.out + sum(counters.rejected.values()) == len(cases) + 2

    # Lower thresholds let the partial chain through; --rules narrows what is checked.
    _, kept, _, _ = run(cli, world, "recall", [rows[names.index("half-gold")]], "--min-recall", "0.5")
    assert len(kept) == 1
    _, kept, _, _ = run(cli, world, "rules", [rows[names.index("wrong-answer")]], "--rules", "format,docid-exists,gold")
    assert len(kept) == 1
    report, kept, _, _ = run(cli, world, "length", [rows[0]], "--max-docids", "1")
    assert not kept and report["reasons"] == {"length-docids": 1}
    tokens = len(text.split())
    _, kept, _, _ = run(cli, world, "tokens-ok", [rows[0]], "--max-chain-tokens", str(tokens))
    assert len(kept) == 1
    report, kept, _, _ = run(cli, world, "tokens", [rows[0]], "--max-chain-tokens", str(tokens - 1))
    assert not kept and report["reasons"] == {"length-tokens": 1}
    # Without docid-exists, gold still refuses a docid that names no stored triple.
    _, kept, rejects, _ = run(cli, world, "gold-only", [rows[names.index("missing")]], "--rules", "gold")
    assert not kept and [e["record"]["reasons"] for e in rejects.values()] == [["gold-unknown-docid"]]


def two_hop_qids(world) -> list[str]:
    """Questions whose two evidence triples sit in their two different gold documents."""
    return [
        qid for qid, f in world["facts"].items()
        if len(f) == 2 and f[0][3] != f[1][3] and {f[0][3], f[1][3]} == set(world["questions"][qid]["gold_doc_ids"])
    ]  # fmt: skip


@pytest.fixture(scope="module")
def collided(world):
    """The world's triples plus two real-looking collisions: question A's first evidence also stored in A's
    other gold document, question B's first evidence also stored in a document that is not gold for B."""
    qa, qb = two_hop_qids(world)[:2]
    (ha, ra, ta, _), (_, _, _, other_gold) = world["facts"][qa]
    hb, rb, tb, _ = world["facts"][qb][0]
    gold_all = {g for q in world["questions"].values() for g in q["gold_doc_ids"]}
    non_gold, other_non_gold = [d for d in world["documents"] if d not in gold_all][:2]
    triples = list(iter_rows(world["triples"]))
    triples.append({"doc_id": other_gold, "idx": 999, "head": ha, "relation": ra, "tail": ta, "docid": docid(ha, ra, ta)})
    triples.append({"doc_id": non_gold, "idx": 999, "head": hb, "relation": rb, "tail": tb, "docid": docid(hb, rb, tb)})
    path = world["root"] / "collided-triples"
    write_stage(path, "triples", TRIPLES, triples)
    return {"path": path, "gold-gold": qa, "gold-non-gold": qb, "other_non_gold": other_non_gold}


def test_a_triple_in_two_gold_documents_covers_both(cli, world, collided):
    qid = collided["gold-gold"]
    q, facts = world["questions"][qid], world["facts"][qid]
    h, r, t, _ = facts[0]
    row = chain_row(qid, f"Start at {h}: {docid(h, r, t)}. So the answer is {q['answer']}.", [docid(h, r, t)])
    report, kept, rejects, _ = run(cli, world, "collide-one", [row], triples=collided["path"])
    assert list(kept) == [(qid, 0)] and not rejects
    _, kept, rejects, _ = run(cli, world, "collide-one-plain", [row])  # without the collision: half the gold
    assert not kept and [e["record"]["reasons"] for e in rejects.values()] == [["gold-recall"]]


def test_a_distinct_triple_adding_no_document_is_new_information(cli, world, collided):
    """The second hop's document was already retrieved through the colliding first triple, but the triple
    is new information (SMR): both modes keep the chain unchanged."""
    qid = collided["gold-gold"]
    q, facts = world["questions"][qid], world["facts"][qid]
    text, docids, _ = good_text(q, facts)
    reordered, redocids, _ = good_text(q, facts[::-1])
    rows = [chain_row(qid, text, docids), chain_row(qid, reordered, redocids, candidate=1)]
    for mode in ("reject", "trim"):
        report, kept, rejects, _ = run(cli, world, f"stale-{mode}", rows, "--redundant", mode, "--all-candidates", triples=collided["path"])
        assert not rejects and kept[(qid, 0)]["text"] == text and kept[(qid, 1)]["text"] == reordered
        assert report["rules"]["redundant"] == 0 and report["trimmed"] == 0


LANTERN = "86649728bac87d593876b611270ab906"  # Where was the director of film The Lantern Keeper born?
BORN_ON = ("Maren Holt", "date of birth", "March 3, 1920")  # the paragraph: "Maren Holt (born March 3, 1920) is a film director."


@pytest.fixture(scope="module")
def two_of_one(world):
    """The world's triples plus a second triple of Maren Holt's paragraph."""
    holt_doc = world["facts"][LANTERN][1][3]
    assert world["documents"][holt_doc]["title"] == "Maren Holt" and "born March 3, 1920" in world["documents"][holt_doc]["text"]
    triples = list(iter_rows(world["triples"]))
    triples.append({"doc_id": holt_doc, "idx": 999, "head": BORN_ON[0], "relation": BORN_ON[1], "tail": BORN_ON[2], "docid": docid(*BORN_ON)})
    path = world["root"] / "two-of-one-triples"
    write_stage(path, "triples", TRIPLES, triples)
    return path


def test_two_triples_of_one_document_pass_and_repeated_steps_are_redundant(cli, world, two_of_one):
    (h0, r0, t0, _), (h1, r1, t1, _) = world["facts"][LANTERN]
    director, born, born_on = docid(h0, r0, t0), docid(h1, r1, t1), docid(*BORN_ON)
    opening = f"The film's director is given by {director}."
    cases = {
        # the prompt examples' shape: two triples of one document in one sentence
        "one-sentence": (f"{opening} Maren Holt was born as {born_on} says, in the place {born} names. So the answer is Tromsø.", [director, born_on, born]),
        "two-sentences": (f"{opening} She was born on a date: {born_on}. Her birthplace is in {born}. So the answer is Tromsø.", [director, born_on, born]),
        # the same thought and the same document twice: the second step re-asks (SMR's equivalent state)
        "repeated-step": (f"{opening} Where was Holt born? {born_on}. Where was Holt born? {born}. So the answer is Tromsø.", [director, born_on, born]),
        "repeated-docid": (f"{opening} Her birthplace is in {born}. Again, {born}. So the answer is Tromsø.", [director, born, born]),
        "repeated-flip": (f"{opening} Her birthplace is in {born}. Read backwards, {docid(t1, r1, h1)}. So the answer is Tromsø.", [director, born, docid(t1, r1, h1)]),
    }
    names = list(cases)
    rows = [chain_row(LANTERN, t, d, candidate=i) for i, (t, d) in enumerate(cases.values())]
    report, kept, rejects, _ = run(cli, world, "two-of-one", rows, "--all-candidates", triples=two_of_one)
    assert {names[c] for _, c in kept} == {"one-sentence", "two-sentences"}
    reasons = {names[c]: e["record"]["reasons"] for (_, c), e in rejects.items()}
    assert reasons == {"repeated-step": ["redundant-repeated-step"], "repeated-docid": ["redundant"], "repeated-flip": ["redundant"]}
    assert "repeats the previous step" in rejects[(LANTERN, names.index("repeated-step"))]["detail"]

    report, kept, rejects, _ = run(cli, world, "two-of-one-trim", rows, "--all-candidates", "--redundant", "trim", triples=two_of_one)
    assert not rejects and report["trimmed"] == 3
    by_name = {names[c]: r for (_, c), r in kept.items()}
    assert by_name["one-sentence"]["text"] == cases["one-sentence"][0]  # nothing to trim
    assert by_name["repeated-step"]["docids"] == [director, born_on]
    assert by_name["repeated-step"]["text"] == f"{opening} Where was Holt born? {born_on}. So the answer is Tromsø."
    assert by_name["repeated-docid"]["text"] == f"{opening} Her birthplace is in {born}. So the answer is Tromsø."
    assert by_name["repeated-flip"]["docids"] == [director, born] and by_name["repeated-flip"]["flipped"] == [False, False]


def test_a_triple_in_a_gold_and_a_non_gold_document_counts_for_the_gold_one(cli, world, collided):
    qid = collided["gold-non-gold"]
    q, facts = world["questions"][qid], world["facts"][qid]
    text, docids, _ = good_text(q, facts)
    doc = world["documents"][collided["other_non_gold"]]
    own = docid(doc["title"], "is the subject of", "a Wikipedia paragraph")  # a triple only a non-gold document holds
    rows = [chain_row(qid, text, docids), chain_row(qid, text.replace(" So the", f" Also {own}. So the"), [*docids, own], candidate=1)]
    report, kept, rejects, _ = run(cli, world, "collide-non-gold", rows, "--all-candidates", triples=collided["path"])
    assert list(kept) == [(qid, 0)]
    assert rejects[(qid, 1)]["record"]["reasons"] == ["gold-outside"] and own in rejects[(qid, 1)]["detail"]


def test_trim_removes_the_repeated_step(cli, world):
    qid = next(q for q, f in world["facts"].items() if len(f) == 2 and world["questions"][q]["type"] == "compositional")
    q, facts = world["questions"][qid], world["facts"][qid]
    text, docids, _ = good_text(q, facts)
    repeated = text.replace(" So the", f" Checking again, {docids[1]} confirms it. So the")
    inline = text.replace(f"{docids[1]} tells", f"{docids[1]} and {docids[0]} tell")
    rows = [chain_row(qid, repeated, [*docids, docids[1]]), chain_row(qid, inline, [docids[0], docids[1], docids[0]], candidate=1)]
    report, kept, rejects, _ = run(cli, world, "trim", rows, "--redundant", "trim", "--all-candidates")
    assert not rejects and report["trimmed"] == 2
    assert kept[(qid, 0)]["text"] == text and kept[(qid, 0)]["docids"] == docids
    assert kept[(qid, 1)]["docids"] == docids and kept[(qid, 1)]["flipped"] == [False, False]
    assert kept[(qid, 1)]["text"] == text.replace(f"{docids[1]} tells", f"{docids[1]} tell")


def test_the_kept_chain_is_the_lowest_score_among_passing_candidates_and_export_sft_takes_it(cli, world, tmp_path):
    """A question whose selected candidate fails keeps a passing one; losses are counted per rule; the yield is
    questions with a kept chain / questions synthesized; `export sft` exports exactly the kept chains."""
    qa, qb, qc, qd = two_hop_qids(world)[:4]

    def variants(qid):
        q = world["questions"][qid]
        text, docids, _ = good_text(q, world["facts"][qid])
        return {
            "good": (text, docids),
            "wrong": (text.replace(f"answer is {q['answer']}", "answer is Doha"), docids),
            "half": (f"Only {docids[0]}. So the answer is {q['answer']}.", [docids[0]]),
            "half-wrong": (f"Only {docids[0]}. So the answer is Doha.", [docids[0]]),
            "flipped": good_text(q, world["facts"][qid], flip={1})[:2],
        }

    def row(qid, c, kind, score, selected=False):
        r = chain_row(qid, *variants(qid)[kind], candidate=c, selected=selected)
        r["score"] = score
        return r

    rows = [
        # A: synthesis selected candidate 0 (lowest entropy) but it fails; of the passing 1 and 2, 2 is surer
        row(qa, 0, "wrong", 0.1, selected=True),
        row(qa, 1, "good", 0.9),
        row(qa, 2, "flipped", 0.4),
        row(qa, 3, "half", 0.2),
        # B: no scores (--select first): the first passing candidate in candidate order
        row(qb, 0, "wrong", None, selected=True),
        row(qb, 1, "flipped", None),
        row(qb, 2, "good", None),
        # C: no candidate passes gold; D: each rule passed by some candidate, never all by one
        row(qc, 0, "half", 0.1, selected=True),
        row(qc, 1, "half-wrong", 0.2),
        row(qd, 0, "wrong", 0.1, selected=True),
        row(qd, 1, "half", 0.2),
    ]
    report, kept, rejects, out = run(cli, world, "choose", rows, "--report", tmp_path / "r.md")
    assert {k for k, r in kept.items() if r["selected"]} == {(qa, 2), (qb, 1)}
    assert set(kept) == {(qa, 1), (qa, 2), (qb, 1), (qb, 2)}  # every passing candidate stays, one marked kept
    assert report["chains"] == 11 and report["passed"] == 4 and report["kept"] == 2
    assert (report["questions"], report["questions_kept"], report["questions_lost"], report["yield"]) == (4, 2, 2, 0.5)
    assert report["lost"] == {"format": 0, "docid-exists": 0, "gold": 1, "answer": 0, "redundant": 0, "length": 0, "question": 0, "mixed": 1}
    d = report["datasets"]["2wikimultihopqa"]
    assert (d["questions"], d["questions_kept"], d["yield"], d["lost"]) == (4, 2, 0.5, {"gold": 1, "mixed": 1})
    md = (tmp_path / "r.md").read_text()
    assert "- yield: **2** of **4** questions keep a chain (**50.0%**)" in md and "| 2wikimultihopqa | 4 | 2 | 50.0% | 11 | 4 | 36.4% |" in md
    assert "| **all** | 2 | 0 | 0 | 1 | 0 | 0 | 0 | 0 | 1 |" in md

    sft = cli("export", "sft", out, "--corpus", world["corpus"], "--out", "-", "--format", "trl-messages")
    exported = sorted(json.loads(line)["messages"][-1]["content"] for line in sft.stdout.splitlines())
    assert exported == sorted([variants(qa)["flipped"][0], variants(qb)["flipped"][0]])

    # --all-candidates keeps (selects) every passing candidate; the summary table carries the yield
    report, kept, _, _ = run(cli, world, "choose-all", rows, "--all-candidates")
    assert all(r["selected"] for r in kept.values()) and report["kept"] == 4 and report["yield"] == 0.5
    chains = world["root"] / "choose-chains"
    proc = cli("filters", "apply", chains, "--corpus", world["corpus"], "--triples", world["triples"], "--out", tmp_path / "o", env={"COLUMNS": "250"})
    assert "2 of 4 questions keep a chain (yield 50.0%)" in " ".join(proc.stderr.split())


def test_custom_markers_from_the_chains_manifest_or_the_options(cli, world):
    cs, ce = "<|ref|>", "<|/ref|>"
    qid = two_hop_qids(world)[0]
    facts = world["facts"][qid]
    rows = [chain_row(qid, *good_text(world["questions"][qid], facts, flip={1}, markers=(cs, ce)))]
    report, kept, _, out = run(cli, world, "markers-manifest", rows, params={"markers": [cs, ce]})
    assert list(kept) == [(qid, 0)] and load_manifest(out).params["markers"] == [cs, ce]
    _, kept, _, _ = run(cli, world, "markers-options", rows, "--docid-start", cs, "--docid-end", ce)
    assert list(kept) == [(qid, 0)]
    _, kept, rejects, _ = run(cli, world, "markers-standard", rows)  # nothing recorded: the standard markers
    assert not kept and rejects[(qid, 0)]["record"]["reasons"][0] == "format-no-docid"
    # Standard-marker chains against a manifest recording custom ones fail too: the manifest is believed.
    std = [chain_row(qid, *good_text(world["questions"][qid], facts))]
    _, kept, _, _ = run(cli, world, "markers-mismatch", std, params={"markers": [cs, ce]})
    assert not kept
    _, kept, _, _ = run(cli, world, "markers-override", std, "--docid-start", S, "--docid-end", E, params={"markers": [cs, ce]})
    assert list(kept) == [(qid, 0)]


# --------------------------------------------------------------- MuSiQue: aliases and unanswerable questions


@pytest.fixture(scope="module")
def musique(tmp_path_factory):
    """MuSiQue-full (answerable and unanswerable) and MuSiQue-Ans dev (answer aliases), really ingested; one
    triple per decomposition step, stored in the step's supporting paragraph (`X >> relation` steps give
    (X, relation, answer), question steps (title, question, answer), with #k replaced by earlier answers)."""
    from grtool.corpus.datasets import UNANSWERABLE_SUFFIX
    from grtool.corpus.doc_hash import doc_id
    from conftest import run_cli

    root = tmp_path_factory.mktemp("filters-musique")
    files = [TEST_DATA / "musique" / "musique_full_v1.0_dev.tests.jsonl", EXAMPLES / "musique" / "musique_ans_v1.0_dev.example.jsonl"]
    run_cli("corpus", "ingest", *files, "--out", root / "corpus")
    questions = {q["qid"]: q for q in InputTable.open(root / "corpus", "questions").iter_rows()}
    triples, facts = [], {}
    for line in (line for f in files for line in f.read_text().splitlines()):
        rec = json.loads(line)
        qid = rec["id"] if rec.get("answerable", True) else rec["id"] + UNANSWERABLE_SUFFIX
        answers, facts[qid] = [], []
        for step in rec["question_decomposition"]:
            asked = re.sub(r"#(\d)", lambda m: answers[int(m.group(1)) - 1], step["question"])
            answers.append(step["answer"])
            if step["paragraph_support_idx"] is None:
                continue
            p = rec["paragraphs"][step["paragraph_support_idx"]]
            h, r = asked.split(" >> ") if " >> " in asked else (p["title"], asked.rstrip(" ?"))
            doc = doc_id(p["title"], p["paragraph_text"])
            triples.append({"doc_id": doc, "idx": len(triples), "head": h, "relation": r, "tail": step["answer"], "docid": docid(h, r, step["answer"])})
            facts[qid].append((h, r, step["answer"], doc))
    assert set(facts) == set(questions)
    write_stage(root / "triples", "triples", TRIPLES, triples)
    return {"root": root, "corpus": root / "corpus", "triples": root / "triples", "questions": questions, "facts": facts}


def test_answer_aliases(cli, musique):
    rialto = next(q for q in musique["questions"].values() if q["answer"] == "Rialto Bridge")
    clinton = next(q for q in musique["questions"].values() if q["answer"] == "Hillary Clinton")
    assert rialto["answer_aliases"] == ["Ponte di Rialto"] and "Clinton" in clinton["answer_aliases"]
    rows = []
    for q, said in ((rialto, "Rialto Bridge"), (rialto, "the Ponte di Rialto!"), (rialto, "Venice"), (clinton, "Clinton"), (clinton, "Trump")):
        text, docids, _ = good_text(q, musique["facts"][q["qid"]])
        rows.append(chain_row(q["qid"], text.replace(f"answer is {q['answer']}.", f"answer is {said}"), docids, candidate=len(rows)))
    report, kept, rejects, _ = run(cli, musique, "aliases", rows, "--all-candidates")
    assert sorted(c for _, c in kept) == [0, 1, 3]
    assert {c: e["record"]["reasons"] for (_, c), e in rejects.items()} == {2: ["answer-wrong"], 4: ["answer-wrong"]}
    assert report["datasets"]["musique"]["kept"] == 3


def test_unanswerable_questions_need_a_cannot_answer_chain_and_no_gold(cli, musique):
    qid = next(q for q, f in musique["facts"].items() if not musique["questions"][q]["answerable"] and f)
    q, facts = musique["questions"][qid], musique["facts"][qid]
    assert q["gold_doc_ids"] == []
    h, r, t, _ = facts[0]
    cannot = f"{h} gives {docid(h, r, t)}. No retrieved triple gives the next hop. The retrieved triples are not enough to answer the question."
    answering, docids, _ = good_text(q, facts)
    # Only the recipe's ending passes: not an answer, not an answer beside it, not another wording.
    both = cannot.replace(" The retrieved", f" So the answer is {q['answer']}. The retrieved")
    worded = cannot.replace("The retrieved triples are not enough to answer the question.", "So the question cannot be answered.")
    rows = [chain_row(qid, text, [docid(h, r, t)] if i != 1 else docids, candidate=i) for i, text in enumerate((cannot, answering, both, worded))]
    _, kept, rejects, _ = run(cli, musique, "unanswerable", rows, "--all-candidates")
    assert list(kept) == [(qid, 0)]
    assert rejects[(qid, 1)]["record"]["reasons"] == ["answer-unanswerable"]  # and no gold-no-gold
    assert rejects[(qid, 2)]["record"]["reasons"] == ["answer-unanswerable"]
    assert rejects[(qid, 3)]["record"]["reasons"] == ["answer-unanswerable-ending"]
    # An answerable twin-style question still fails a "cannot answer" chain and a chain without its gold.
    other = next(q for q, f in musique["facts"].items() if musique["questions"][q]["answerable"] and len(f) >= 2)
    h2, r2, t2, _ = musique["facts"][other][0]
    rows = [chain_row(other, cannot.replace(docid(h, r, t), docid(h2, r2, t2)).replace(h, h2, 1), [docid(h2, r2, t2)])]
    _, kept, rejects, _ = run(cli, musique, "answerable-cannot", rows)
    assert not kept and rejects[(other, 0)]["record"]["reasons"] == ["gold-recall", "answer-cannot-answer"]


def test_unanswerable_endings_accept_the_papers_wording_and_a_configured_one(cli, musique):
    qid = next(q for q, f in musique["facts"].items() if not musique["questions"][q]["answerable"] and f)
    h, r, t, _ = musique["facts"][qid][0]
    start = f"{h} gives {docid(h, r, t)}. No retrieved triple gives the next hop."
    endings = (
        "The question cannot be answered based on the retrieved triples.",  # the paper's wording
        "Therefore, I can't answer this question from the retrieved information.",  # a close paraphrase of it
        "Sorry, no idea.",  # the configured sentence
        "The question is hard.",  # neither: still rejected
        "So the question cannot be answered.",  # a cannot-answer statement without grtool's or the paper's words
    )
    rows = [chain_row(qid, f"{start} {e}", [docid(h, r, t)], candidate=i) for i, e in enumerate(endings)]
    _, kept, rejects, out = run(cli, musique, "paper-wording", rows, "--all-candidates", "--cannot-answer", "sorry, no idea")
    assert sorted(c for _, c in kept) == [0, 1, 2]
    assert rejects[(qid, 3)]["record"]["reasons"] == ["answer-unanswerable-ending"]
    assert rejects[(qid, 4)]["record"]["reasons"] == ["answer-unanswerable-ending"]
    assert json.loads((out / "_manifest.json").read_text())["params"]["cannot_answer"] == "sorry, no idea"
    # Without the option, the configured sentence is just another wrong ending.
    _, kept, rejects, _ = run(cli, musique, "paper-wording-default", rows, "--all-candidates")
    assert sorted(c for _, c in kept) == [0, 1]
    assert "--cannot-answer" in cli("filters", "apply", "-", "--corpus", musique["corpus"], "--triples", musique["triples"], "--out", "-", "--cannot-answer", " ", input="", check=2).stderr
    assert says_cannot_answer("I cannot answer the question based on the retrieved triples.")
    # The sentence `chains synthesize --cannot-answer` recorded is the default of `filters apply`.
    _, kept, _, _ = run(cli, musique, "paper-wording-recorded", rows, "--all-candidates", params={"cannot_answer": "Sorry, no idea."})
    assert sorted(c for _, c in kept) == [0, 1, 2]


def test_input_errors_exit_2(cli, world, tmp_path):
    args = ["--corpus", world["corpus"], "--triples", world["triples"], "--out", tmp_path / "o"]
    assert "nope" in cli("filters", "apply", tmp_path / "nope", *args, check=2).stderr
    write_stage(tmp_path / "c", "chains", CHAINS, [])
    assert "missing" in cli("filters", "apply", tmp_path / "c", "--corpus", tmp_path / "missing", "--triples", world["triples"], "--out", tmp_path / "o2", check=2).stderr
    assert "unknown rule" in cli("filters", "apply", tmp_path / "c", *args, "--rules", "format,vibes", check=2).stderr
    assert "markers" in cli("filters", "apply", tmp_path / "c", *args, "--docid-start", "|", "--docid-end", "|", check=2).stderr
    # An empty chains stage gives an empty result: exit 1 naming the empty input, unless --allow-empty.
    assert "has no rows" in cli("filters", "apply", tmp_path / "c", *args, check=1).stderr
    report = json.loads(cli("filters", "apply", tmp_path / "c", *args, "--json", "--overwrite", "--allow-empty").stdout)
    assert report["chains"] == 0 and report["pass_rate"] is None


def test_stdin_to_stdout_pipeline(cli, world):
    qid, facts = next(iter(world["facts"].items()))
    text, docids, flipped = good_text(world["questions"][qid], facts)
    lines = "\n".join(json.dumps(chain_row(qid, t, docids, flipped, candidate=i)) for i, t in enumerate([text, text.replace(E, "", 1)]))
    proc = cli("filters", "apply", "-", "--corpus", world["corpus"], "--triples", world["triples"], "--out", "-", input=lines)
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["candidate"] for r in out] == [0]
    assert "format-markers" in proc.stderr


# --------------------------------------------------------------------------------- text helpers


def test_squad_normalization_and_whole_word_answers():
    assert normalize_answer("The  Eagle's Claw!") == "eagles claw"
    assert contains_answer(normalize_answer("So the answer is 1901."), ("1901",))
    assert not contains_answer(normalize_answer("It premiered in 1901."), ("1",))
    assert contains_answer(normalize_answer("answer: Al-Khor"), (normalize_answer("Al Khor"), normalize_answer("alkhor")))


def test_conclusion_is_after_the_last_answer_phrase_or_retrieval():
    text = f"The answer is not obvious. {docid('A', 'r', 'Paris')}. So the answer is London."
    start = len(text) - len(". So the answer is London.")
    assert conclusion(text, start).strip() == "London."
    no_phrase = f"{docid('A', 'born in', 'Paris')}. Hence Paris."
    assert conclusion(no_phrase, no_phrase.index(". Hence")) == ". Hence Paris."
    assert says_cannot_answer("The retrieved triples are not enough to answer the question.")
    assert says_cannot_answer("So this cannot be answered from the triples.")
    assert not says_cannot_answer("So the answer is Nelahozeves.")


def test_marker_parsing():
    m = Markers()
    pattern = m.pattern()
    p = parse_markers(f"a {docid('x', 'y', 'z')} b {docid('u', 'v', 'w')}.", m, pattern)
    assert p.problem is None and p.docids == [docid("x", "y", "z"), docid("u", "v", "w")] and p.outside == ["a ", " b ", "."]
    assert "nested" in parse_markers(f"{S}{S}x{E}", m, pattern).problem
    assert "never closed" in parse_markers(f"{S}x", m, pattern).problem
    assert "without a start" in parse_markers(f"x{E}", m, pattern).problem
    assert re.escape(S) in pattern.pattern


def test_a_finished_stage_resumes_after_grtool_writes_beside_its_inputs(cli, samples, tmp_path):
    """--corpus and --triples given as a run directory are recorded as the stages read there, not as the run
    directory's loose files: a plot or a report written into it keeps the stage done (before: "exists with different
    inputs", every rerun). A manifest of an older grtool, which recorded the run directory (and fingerprinted only its
    loose files, so a change of its questions went unseen), cannot vouch for the stages: --overwrite remakes it."""
    import shutil

    from sample_helpers import write_chains

    root = tmp_path / "run"
    shutil.copytree(samples["root"], root)
    write_chains(samples, tmp_path / "chains")
    out = tmp_path / "filtered"
    apply = ["filters", "apply", tmp_path / "chains", "--corpus", root, "--triples", root, "--out", out, "--allow-empty"]
    cli(*apply)
    cli("corpus", "stats", root, "--plot", root / "stats.png")
    cli(*apply, "--report", root / "filters.md")  # both beside the inputs, in the run directory
    cli(*apply, "--report", root / "filters.md")
    manifest = json.loads((out / "_manifest.json").read_text())
    assert [Path(i["path"]).name for i in manifest["inputs"]][1:] == ["questions", "triples"]
    manifest["inputs"][1] = {"path": str(root), "kind": "tree", "files": 0, "blake3": "0" * 64}  # as an older grtool recorded it
    (out / "_manifest.json").write_text(json.dumps(manifest))
    assert "exists with different inputs" in " ".join(cli(*apply, check=2).stderr.split())
    cli(*apply, "--overwrite")
