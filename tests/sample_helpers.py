"""The samples corpus many export, evaluation, retrieval and training tests share: `grtool corpus ingest` of a few
2WikiMultihopQA and MuSiQue files, a triples stage beside it, hand-checked responses and their recall, and chains
stages written from it.

Not moved to our own records yet: it still reads three files of ../shared/data (its hand-checked values are about
their questions), so where they are absent its tests skip under SAMPLES_ABSENT, counted apart in the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SAMPLES_ABSENT, SHARED_DATA, run_cli
from grtool.store.schemas import CHAINS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, read_table


WIKI = "2wikimultihopqa"


MUSIQUE = "musique"


# Real question ids of the samples used in hand-checked cases.
Q_MOZA = "20aa14f60bdc11eba7f7acde48001122"  # Where was the mother of Mohammed Bin Hamad Bin Khalifa Al Thani born?


Q_ANA = "a643672c0bda11eba7f7acde48001122"  # What is the place of birth of the director of film Ana, Mon Amour?


Q_WALTZ = "917222f308c911ebbd92ac1f6bf848b6"  # bridge_comparison, four gold documents


Q_FAIR_LADY = "2hop__82713_84616"  # MuSiQue: What did the actress in My Fair Lady win a Tony for?


# Triples read off the paragraph texts by hand (title of the paragraph → triples).
HAND_TRIPLES = {
    "Mohammed bin Hamad bin Khalifa Al Thani": [
        ("Hamad bin Khalifa Al Thani", "second wife", "Moza bint Nasser"),
        ("Mohammed bin Hamad bin Khalifa Al Thani", "date of birth", "18 April 1988"),
    ],
    "Moza bint Nasser": [("Moza bint Nasser", "date of birth", "January 15, 1959")],
    "Joaan bin Hamad bin Khalifa Al Thani": [
        ("Hamad bin Khalifa Al Thani", "second wife", "Moza bint Nasser"),
        ("Joaan bin Hamad bin Khalifa Al Thani", "date of birth", "23 July 1986"),
    ],
    "Jassim bin Hamad bin Khalifa Al Thani": [("Hamad bin Khalifa Al Thani", "second wife", "Moza bint Nasser")],
    "My Fair Lady (film)": [("My Fair Lady (film)", "stars", "Audrey Hepburn")],
    "List of awards and honours received by Audrey Hepburn": [("Audrey Hepburn", "won Tony Award for", "Best Performance by a Leading Actress in a Play in Ondine")],
}


def write_stage(path: Path, table: str, schema, rows: list[dict], params: dict | None = None, inputs: list[str] | None = None) -> None:
    stage = StageWriter(path, StageSpec(table, schema, params or {}, inputs or []), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()


SAMPLE_FILES = ("2wikimultihopqa/data_ids_dev.sample.json", "2wikimultihopqa/dev.sample.json", "musique/musique_ans_v1.0_dev.sample.jsonl")


def build_samples(root: Path) -> dict:
    """`grtool corpus ingest` over the real samples into ``root``, plus a triples stage beside it.

    Triples: 2Wiki's `evidences` (kept by ingest in `meta`), each on its head's paragraph, and
    :data:`HAND_TRIPLES`. Returns the lookups the checks need: title → doc_id, qid → gold titles,
    qid → question text, and the documents by doc_id.
    """
    if not SHARED_DATA.is_dir():
        pytest.skip(SAMPLES_ABSENT)
    run_cli("corpus", "ingest", *(SHARED_DATA / f for f in SAMPLE_FILES), "--out", root)
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


def D(start: str = "<docid_start>", end: str = "<docid_end>"):
    return lambda h, r, t: f"{start}{h}, {r}, {t}{end}"


SPECIAL = D()


# Responses as a sampled SFT model might write them, with their recall worked out by hand.
MOZA_EXACT = (
    f"The mother: {SPECIAL('Mohammed bin Hamad bin Khalifa Al Thani', 'mother', 'Moza bint Nasser')} Her birthplace: "
    f"{SPECIAL('Moza bint Nasser', 'place of birth', 'Al Khor')} So the answer is Al Khor."
)  # {M, Z} = gold: recall 1, exact → desirable


# the collision retrieves M, Joaan and Jassim: recall 1 but not exact → dropped at any tau
MOZA_COLLIDING = "[Hamad bin Khalifa Al Thani, second wife, Moza bint Nasser] [Moza bint Nasser, place of birth, Al Khor] Al Khor."


MOZA_FLIPPED_AND_HALLUCINATED = (
    f"{SPECIAL('Al Khor', 'place of birth', 'Moza bint Nasser')} {SPECIAL('Moza bint Nasser', 'mother of', 'Mohammed bin Hamad')}"  # flipped Z triple + one hallucinated docid: recall 0.5
)


MOZA_MALFORMED = (
    f"{SPECIAL('Mohammed bin Hamad bin Khalifa Al Thani', 'mother', 'Moza bint Nasser')} then <docid_start><docid_end> "
    "and [Moza bint Nasser] and <docid_start>Moza bint Nasser, place of birth"
)  # one docid (M), three malformed spans: recall 0.5


MOZA_NOTHING = "I cannot answer this question from what I know."  # recall 0 → undesirable


ANA_BRACKETS = "[Ana, mon amour, director, Călin Peter Netzer] He was born somewhere."  # comma in the head: recall 0.5


# first docid flipped (and commas in the flipped head): {A, C} = gold, exact → desirable
ANA_FLIPPED_EXACT = f"{SPECIAL('Călin Peter Netzer', 'director', 'Ana, mon amour')} {SPECIAL('Călin Peter Netzer', 'place of birth', 'Petroșani')}"


WALTZ_ONE_OF_FOUR = "[Two Hearts in Waltz Time, director, Géza von Bolváry]"  # recall 0.25


FAIR_LADY_HALF = "[My Fair Lady (film), stars, Audrey Hepburn]"  # MuSiQue, recall 0.5


RESPONSES = [
    (Q_MOZA, MOZA_EXACT),
    (Q_MOZA, MOZA_COLLIDING),
    (Q_MOZA, MOZA_FLIPPED_AND_HALLUCINATED),
    (Q_MOZA, MOZA_MALFORMED),
    (Q_ANA, ANA_BRACKETS),
    (Q_ANA, ANA_FLIPPED_EXACT),
    (Q_FAIR_LADY, FAIR_LADY_HALF),
    (Q_MOZA, MOZA_NOTHING),
    (Q_WALTZ, WALTZ_ONE_OF_FOUR),
    ("no-such-question", MOZA_EXACT),
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
