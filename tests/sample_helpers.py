"""The samples corpus many export, evaluation, retrieval and training tests share: `grtool corpus ingest` of our own
2WikiMultihopQA and MuSiQue records in tests/data/ (``*.samples.*``: 10 + 6 dev questions of invented text), a
triples stage beside it, hand-checked responses and their recall, and chains stages written from it.

The records are written to hold the cases the checks need: a mother question whose distractors share the triple
(Aurel Venn Alder, second wife, Liva Marren) with its first gold paragraph (a three-document collision), a film
title with a comma, a bridge comparison with four gold documents, and a MuSiQue question whose hop order differs
from its paragraph order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import TEST_DATA, run_cli
from grtool.store.schemas import CHAINS, QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, read_table


WIKI = "2wikimultihopqa"


MUSIQUE = "musique"


# Question ids of the samples used in hand-checked cases.
Q_MOTHER = "6ee6a213cb02554a63b1867143572e70"  # Where was the mother of Oskar Venn Alder born?


Q_MARA = "3d4e992d8d8a7d848724aa26ed7f4176"  # What is the place of birth of the director of film Mara, My Harbour?


Q_BELLS = "8891c81db8392d8e401378ef5517ddb1"  # bridge_comparison, four gold documents


Q_TIN = "2hop__910001_910002"  # MuSiQue: What did the actress in Harbor of Tin win a Lark Award for?


Q_MUSEUM = "eb0ea0bc6c91e1e8058ddddfa6192ce7"  # Which museum was established first, Museum Of Salt Roads or Kellin Clock Museum?


# Questions where the embedded model, left free, cites triples it was not offered within its first 48 tokens (and,
# constrained, cites offered ones): the constrained-chains tests run on these alone.
CITING_QUESTIONS = (Q_BELLS, Q_MUSEUM, Q_TIN)


# Triples read off the paragraph texts by hand (title of the paragraph → triples).
HAND_TRIPLES = {
    "Oskar Venn Alder": [
        ("Aurel Venn Alder", "second wife", "Liva Marren"),
        ("Oskar Venn Alder", "date of birth", "18 April 1988"),
    ],
    "Liva Marren": [("Liva Marren", "date of birth", "March 4, 1961")],
    "Tobin Venn Alder": [
        ("Aurel Venn Alder", "second wife", "Liva Marren"),
        ("Tobin Venn Alder", "date of birth", "23 July 1986"),
    ],
    "Emil Venn Alder": [("Aurel Venn Alder", "second wife", "Liva Marren")],
    "Harbor of Tin (film)": [("Harbor of Tin (film)", "stars", "Nela Quist")],
    "List of awards received by Nela Quist": [("Nela Quist", "won Lark Award for", "Best Leading Actress in a Play in The Salt Orchard")],
}


def write_stage(path: Path, table: str, schema, rows: list[dict], params: dict | None = None, inputs: list[str] | None = None) -> None:
    stage = StageWriter(path, StageSpec(table, schema, params or {}, inputs or []), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()


SAMPLE_FILES = ("2wikimultihopqa/data_ids_dev.samples.json", "2wikimultihopqa/dev.samples.json", "musique/musique_ans_v1.0_dev.samples.jsonl")


def build_samples(root: Path) -> dict:
    """`grtool corpus ingest` over the samples into ``root``, plus a triples stage beside it.

    Triples: 2Wiki's `evidences` (kept by ingest in `meta`), each on its head's paragraph, and
    :data:`HAND_TRIPLES`. Returns the lookups the checks need: title → doc_id, qid → gold titles,
    qid → question text, and the documents by doc_id.
    """
    run_cli("corpus", "ingest", *(TEST_DATA / f for f in SAMPLE_FILES), "--out", root)
    documents = {d["doc_id"]: d for d in read_table(root / "documents").to_pylist()}
    questions = read_table(root / "questions").to_pylist()
    by_title: dict[str, list[str]] = {}
    for d in documents.values():
        by_title.setdefault(d["title"], []).append(d["doc_id"])

    triples: list[tuple[str, str, str, str]] = []  # (doc_id, head, relation, tail)
    for q in questions:
        for head, relation, tail in json.loads(q["meta"]).get("evidences", []):
            holders = [d for d in by_title.get(head, []) if d in q["gold_doc_ids"]]
            if holders:  # a 2Wiki evidence triple is about the gold paragraph titled by its head
                triples.append((holders[0], head, relation, tail))
    for title, extra in HAND_TRIPLES.items():
        (holder,) = by_title[title]
        triples += [(holder, *t) for t in extra]
    idx: dict[str, int] = {}
    rows = []
    for did, head, relation, tail in triples:
        idx[did] = idx.get(did, -1) + 1
        rows.append({"doc_id": did, "idx": idx[did], "head": head, "relation": relation, "tail": tail, "docid": f"<docid_start>{head}, {relation}, {tail}<docid_end>"})
    write_stage(root / "triples", "triples", TRIPLES, rows)
    return {
        "doc": {title: ids[0] for title, ids in by_title.items()},
        "gold": {q["qid"]: [documents[d]["title"] for d in q["gold_doc_ids"]] for q in questions},
        "dataset": {q["qid"]: q["dataset"] for q in questions},
        "question": {q["qid"]: q["question"] for q in questions},
        "documents": documents,
    }


def keep_questions(root: Path, qids) -> None:
    """Rewrite the questions stage of the run ``root`` to hold only ``qids`` (a smaller run for slow model tests)."""
    rows = [q for q in read_table(root / "questions").to_pylist() if q["qid"] in set(qids)]
    assert len(rows) == len(qids), f"questions missing from the samples: {set(qids) - {q['qid'] for q in rows}}"
    shutil.rmtree(root / "questions")
    write_stage(root / "questions", "questions", QUESTIONS, rows)


def D(start: str = "<docid_start>", end: str = "<docid_end>"):
    return lambda h, r, t: f"{start}{h}, {r}, {t}{end}"


SPECIAL = D()


# Responses as a sampled SFT model might write them, with their recall worked out by hand.
MOTHER_EXACT = (
    f"The mother: {SPECIAL('Oskar Venn Alder', 'mother', 'Liva Marren')} Her birthplace: "
    f"{SPECIAL('Liva Marren', 'place of birth', 'Sorvik')} So the answer is Sorvik."
)  # {M, Z} = gold: recall 1, exact → desirable


# the collision retrieves M, Tobin and Emil: recall 1 but not exact → dropped at any tau
MOTHER_COLLIDING = "[Aurel Venn Alder, second wife, Liva Marren] [Liva Marren, place of birth, Sorvik] Sorvik."


MOTHER_FLIPPED_AND_HALLUCINATED = f"{SPECIAL('Sorvik', 'place of birth', 'Liva Marren')} {SPECIAL('Liva Marren', 'mother of', 'Oskar Venn')}"  # flipped Z triple + one hallucinated docid: recall 0.5


MOTHER_MALFORMED = (
    f"{SPECIAL('Oskar Venn Alder', 'mother', 'Liva Marren')} then <docid_start><docid_end> "
    "and [Liva Marren] and <docid_start>Liva Marren, place of birth"
)  # one docid (M), three malformed spans: recall 0.5


MOTHER_NOTHING = "I cannot answer this question from what I know."  # recall 0 → undesirable


MARA_BRACKETS = "[Mara, my harbour, director, Doru Petru Vlaicu] He was born somewhere."  # comma in the head: recall 0.5


# first docid flipped (and commas in the flipped head): {A, C} = gold, exact → desirable
MARA_FLIPPED_EXACT = f"{SPECIAL('Doru Petru Vlaicu', 'director', 'Mara, my harbour')} {SPECIAL('Doru Petru Vlaicu', 'place of birth', 'Sălcioara')}"


BELLS_ONE_OF_FOUR = "[Three Bells at Noon, director, Hedda von Koralin]"  # recall 0.25


TIN_HALF = "[Harbor of Tin (film), stars, Nela Quist]"  # MuSiQue, recall 0.5


RESPONSES = [
    (Q_MOTHER, MOTHER_EXACT),
    (Q_MOTHER, MOTHER_COLLIDING),
    (Q_MOTHER, MOTHER_FLIPPED_AND_HALLUCINATED),
    (Q_MOTHER, MOTHER_MALFORMED),
    (Q_MARA, MARA_BRACKETS),
    (Q_MARA, MARA_FLIPPED_EXACT),
    (Q_TIN, TIN_HALF),
    (Q_MOTHER, MOTHER_NOTHING),
    (Q_BELLS, BELLS_ONE_OF_FOUR),
    ("no-such-question", MOTHER_EXACT),
]


def write_responses(path: Path, responses=RESPONSES) -> Path:
    path.write_text("".join(json.dumps({"qid": q, "response": r}, ensure_ascii=False) + "\n" for q, r in responses))
    return path


def _chain_for(title_gold: list[str], question: str) -> str:
    return f"To answer '{question}' I retrieve " + " then ".join(SPECIAL(t, "is about", "something") for t in title_gold) + "."


def write_chains(samples: dict, path: Path) -> dict[str, str]:
    """A filtered-chains stage: one selected chain per sample question, plus a non-selected one and an unknown qid."""
    rows, chains = [], {}
    for qid, titles in samples["gold"].items():
        text = _chain_for(titles, samples["question"][qid])
        chains[qid] = text
        rows.append({"qid": qid, "candidate": 0, "text": text, "docids": [], "flipped": [], "selected": True, "score": 0.1, "model": "m", "temperature": 0.0, "finish_reason": "stop"})
    rows.append({**rows[0], "candidate": 1, "text": "a second candidate", "selected": False})
    rows.append({**rows[0], "qid": "ghost-question", "text": "orphan"})
    write_stage(path, "chains", CHAINS, rows)
    return chains
