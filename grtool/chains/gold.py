"""`chains gold`: a chain per question written from its gold triples by rule, with no model (the teacher `gold`).

It is the recipe's chain with perfect retrievals and plain thoughts (the paper's w/o-Thought-quality ablation),
and the data of the train-retrieve consistency test. Per question, in hop order:

- which triples: the dataset's own gold triples when the question carries them (2Wiki's ``evidences``) and the
  triples stage holds them on a gold document (either orientation); otherwise, per gold document in hop order,
  the triple that best connects what is known (the question, the triples before it) to the next entity or the
  answer. A gold document none of whose triples connects is a reject (``no connecting triple``);
- each step is one sentence from the relation naming only what is known, then the docid: ``I look up the
  {relation} of {head}. <docid_start>head, relation, tail<docid_end>``, or ``I look up what has {tail} as
  {relation}.`` when the tail is known and the head is not; ``--flip auto`` writes exactly those docids tail-first
  (from the known to the unknown), ``always`` every docid, ``never`` none;
- the chain ends ``So the answer is {answer}.``

Rows are the chains table's (one candidate, selected, ``model = gold``), so `filters apply` and `export sft` take
them as they take a model's. Rejects, one per question: ``not answerable``, ``no gold documents``, ``no answer``,
``gold documents without triples``, ``no connecting triple``. One output part per questions part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grtool.chains.docids import Triple
from grtool.chains.triples import TripleStore
from grtool.docid import SPECIAL, Markers, loose_key
from grtool.vocab.text import normalize_answer
from grtool.triples.evidence import question_evidences

MODEL = "gold"
FLIP_MODES = ("auto", "never", "always")
WRITER_VERSION = 1  # bump when the wording or the choice of triples changes (it is in the manifest's parameters)


@dataclass(frozen=True)
class Step:
    triple: Triple
    flipped: bool  # the docid is written tail-first
    from_tail: bool = False  # the thought starts from the tail (known while the head is not)


class NoChain(Exception):
    """Why a question gets no gold chain: a reject reason and its detail."""

    def __init__(self, reason: str, detail: str | None = None):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


def choose_steps(question: str, answer: str, gold_doc_ids: Sequence[str], by_doc: dict[str, list[Triple]],
                 evidences: Sequence[tuple[str, str, str]] = (), flip: str = "auto") -> list[Step]:  # fmt: skip
    """The triples a gold chain retrieves, in order, each with its orientation; raises :class:`NoChain`."""
    missing = [d for d in gold_doc_ids if not by_doc.get(d)]
    if missing:
        raise NoChain("gold documents without triples", f"{len(missing)} of {len(gold_doc_ids)} gold documents have no triples: {', '.join(missing[:5])}")
    chosen: list[Triple] = []
    forward: dict[str, Triple] = {}
    backward: dict[str, Triple] = {}
    for d in gold_doc_ids:
        for t in by_doc[d]:
            forward.setdefault(loose_key(t.text()), t)
            backward.setdefault(loose_key(f"{t.tail}, {t.relation}, {t.head}"), t)
    for head, relation, tail in evidences:  # the dataset's own hops, in its order
        key = loose_key(f"{head}, {relation}, {tail}")
        t = forward.get(key) or backward.get(key)
        if t is not None and t not in chosen:
            chosen.append(t)
    known = [question.casefold()] + [p.casefold() for t in chosen for p in (t.head, t.tail)]
    covered = {t.doc_id for t in chosen}
    for d in gold_doc_ids:  # gold documents the evidences do not reach: the triple that connects best
        if d in covered:
            continue
        best = max(by_doc[d], key=lambda t: _connection(t, known, answer))  # the first of equals: extraction order
        if _connection(best, known, answer) == 0:
            raise NoChain("no connecting triple", f"gold document {d}: none of its {len(by_doc[d])} triples names the question's entities, an earlier triple's or the answer")
        chosen.append(best)
        known += [best.head.casefold(), best.tail.casefold()]
    steps, known = [], [question.casefold()]
    for t in chosen:
        from_tail = _mentioned(t.tail, known) and not _mentioned(t.head, known)
        steps.append(Step(t, from_tail if flip == "auto" else flip == "always", from_tail))
        known += [t.head.casefold(), t.tail.casefold()]
    return steps


def _mentioned(part: str, known: Sequence[str]) -> bool:
    part = part.casefold().strip()
    return bool(part) and any(part in k for k in known)


def _connection(t: Triple, known: Sequence[str], answer: str) -> int:
    """How well a triple links what is known to the answer: 2 for naming the answer, 1 per known part."""
    a = normalize_answer(answer)
    names_answer = bool(a) and a in (normalize_answer(t.tail), normalize_answer(t.head))
    return 2 * names_answer + _mentioned(t.head, known) + _mentioned(t.tail, known)


def write_chain(steps: Sequence[Step], answer: str, markers: Markers = SPECIAL) -> tuple[str, list[str], list[bool]]:
    """The chain's text, its docids in order and their flips."""
    pieces, docids = [], []
    for s in steps:
        t = s.triple
        # the thought names only what is known: the value looked up comes from the docid, never before it
        thought = f"I look up what has {t.tail} as {t.relation}." if s.from_tail else f"I look up the {t.relation} of {t.head}."
        docid = markers.render(t.tail, t.relation, t.head) if s.flipped else markers.render(t.head, t.relation, t.tail)
        pieces.append(f"{thought} {docid}")
        docids.append(docid)
    pieces.append(f"So the answer is {answer.strip()}.")
    return " ".join(pieces), docids, [s.flipped for s in steps]


def gold_chain_row(row: dict[str, Any], by_doc: dict[str, list[Triple]], flip: str = "auto", markers: Markers = SPECIAL) -> dict[str, Any]:
    """The chains-table row of one question; raises :class:`NoChain`."""
    if row.get("answerable") is False:
        raise NoChain("not answerable", "the gold writer answers from gold triples; this question has none")
    gold = list(dict.fromkeys(g for g in (row.get("gold_doc_ids") or []) if g))
    if not gold:
        raise NoChain("no gold documents")
    answer = (row.get("answer") or "").strip()
    if not answer:
        raise NoChain("no answer", "the question's answer is empty")
    steps = choose_steps(row.get("question") or "", answer, gold, by_doc, question_evidences(row.get("meta")), flip)
    text, docids, flipped = write_chain(steps, answer, markers)
    return {"qid": row["qid"], "candidate": 0, "text": text, "docids": docids, "flipped": flipped, "selected": True,
            "score": None, "model": MODEL, "temperature": 0.0, "finish_reason": "stop"}  # fmt: skip


def write_gold_chains(corpus: str, triples: str, out: str, *, flip: str = "auto", markers: Markers = SPECIAL, overwrite: bool = False,
                      num_shards: int | None = None, shard_index: int | None = None, splits: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """Run the stage over this task's parts; returns the output manifest."""
    from grtool.errors import InputError
    from grtool.store.coverage import check_triples_cover
    from grtool.store.io import InputTable
    from grtool.store.partloop import Bar, LoopPart, Output, PartLoop
    from grtool.store.schemas import CHAINS
    from grtool.store.stage import StageSpec

    if flip not in FLIP_MODES:
        raise InputError(f"--flip must be one of {', '.join(FLIP_MODES)}, got {flip!r}")
    from grtool.store.questions import SplitSelection

    questions = InputTable.open(corpus, "questions")
    selection = SplitSelection.of(splits, corpus)
    store = TripleStore(triples)
    check_triples_cover(store.path, corpus)
    params = selection.record({"backend": MODEL, "model": MODEL, "flip": flip, "markers": [markers.start, markers.end], "writer_version": WRITER_VERSION})
    inputs = [questions.source, str(store.path)]  # standard input too ("-"): a run from it is never resumed with other rows
    loop = PartLoop([Output(out, StageSpec("chains", CHAINS, params, inputs=inputs))], questions.num_parts, overwrite=overwrite,
                    num_shards=num_shards, shard_index=shard_index)  # fmt: skip

    def write_part(part: LoopPart) -> None:
        shard, found = part.shard, questions.parts[part.index]
        source = f"{questions.source}/{found.name}" if found is not None else "<stdin>"
        position = 0
        for rows in questions.iter_part(part.index):
            by_doc = store.for_docs(g for r in rows if selection.keeps(r.get("split")) for g in (r.get("gold_doc_ids") or []) if g)
            out_rows = []
            for r in rows:
                if not selection.keeps(r.get("split")):  # --split: not read (counted, not rejected)
                    shard.count("questions_not_selected")
                    position += 1
                    continue
                shard.count_in(1)
                shard.count("questions")
                try:
                    out_rows.append(gold_chain_row(r, by_doc, flip, markers))
                except NoChain as why:
                    shard.reject({"qid": r.get("qid")}, why.reason, source=source, position=position, detail=why.detail)
                else:
                    shard.count("questions_chained")
                    shard.count("docids", len(out_rows[-1]["docids"]))
                    shard.count("docids_flipped", sum(out_rows[-1]["flipped"]))
                position += 1
            if out_rows:
                shard.write_rows(out_rows)

    loop.run(write_part, Bar("writing gold chains"))
    (manifest,) = loop.finish()
    return manifest
