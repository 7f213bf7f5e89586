"""`grtool eval answer RESPONSES --model M --out A`: a reader answers each question from the documents its
response retrieved, and the answer is scored (:mod:`grtool.evaluation.answers`).

The reader is any backend of the LLM layer. One row per question (its first response: sample 0), written as an
``answers`` stage part by part of the responses stage, so the run is sharded, resumable and cached like every
model stage (:class:`grtool.llm.stage_runner.ModelStage`). The prompt gives the documents (title, then text)
in the order the response named them, then the question, and asks for the answer alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from grtool.errors import InputError
from grtool.evaluation.answers import GoldAnswer, best_scores, gold_answers
from grtool.llm.base import TOO_LONG, Backend, Sampling
from grtool.llm.guard import DEFAULT_MAX_EMPTY_SHARE

INSTRUCTION = "Read the documents, then answer the question with a few words taken from them. Write the answer only, not a sentence."


def reader_messages(question: str, documents: list[tuple[str, str]]) -> list[dict[str, str]]:
    shown = "\n\n".join(f"Document {i}: {title}\n{text}" for i, (title, text) in enumerate(documents, 1))
    return [{"role": "user", "content": f"{INSTRUCTION}\n\n{shown}\n\nQuestion: {question}\nAnswer:"}]


JUDGE_INSTRUCTION = (
    "You check a proposed answer to a question against the reference answers. Say yes when the proposed answer "
    "names the same thing as one of the references (other wording is fine), no otherwise. Reply with one word: yes or no."
)


def judge_messages(question: str, answers: list[str], prediction: str) -> list[dict[str, str]]:
    references = "; ".join(answers)
    return [{"role": "user", "content": f"{JUDGE_INSTRUCTION}\n\nQuestion: {question}\nReference answers: {references}\nProposed answer: {prediction}\nVerdict:"}]


def verdict_of(text: str) -> bool | None:
    """The judge's yes (True) or no (False), from its first word; None when it wrote neither."""
    words = text.strip().lower().split()
    first = words[0].strip(".,:;!\"'*") if words else ""
    return True if first == "yes" else False if first == "no" else None


def prediction_of(text: str) -> str:
    """What is scored of a reader's text: its first non-blank line, without an "Answer:" the model repeated."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first[len("answer:") :].strip() if first.lower().startswith("answer:") else first


def documents_by_id(corpus: str | Path, wanted: set[str]) -> dict[str, tuple[str, str]]:
    """doc id → (title, text) of the wanted documents, streaming the corpus's documents stage once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from grtool.evaluation.per_question import stage_beside
    from grtool.store.stage import iter_batches

    if not wanted:
        return {}
    stage = stage_beside(Path(corpus), "documents")
    if stage is None:
        raise InputError(f"{corpus}: no documents stage here or beside it: the reader needs the documents' text")
    keys = pa.array(sorted(wanted), pa.string())
    found: dict[str, tuple[str, str]] = {}
    for batch in iter_batches(stage, columns=["doc_id", "title", "text"]):
        hits = batch.filter(pc.is_in(batch.column("doc_id"), value_set=keys)).to_pydict()
        found.update((d, (t or "", x or "")) for d, t, x in zip(hits["doc_id"], hits["title"], hits["text"]))
    return found


def run_reader(
    responses: str | Path,
    corpus: str | Path,
    out: str | Path,
    backend: Callable[[], Backend],
    sampling: Sampling,
    *,
    model_name: str | None,
    params: dict[str, Any],
    cache_dir: Path | None = None,
    overwrite: bool = False,
    num_shards: int | None = None,
    shard_index: int | None = None,
    max_empty_share: float = DEFAULT_MAX_EMPTY_SHARE,
    judge: Callable[[], Backend] | None = None,
) -> dict[str, Any]:
    """Run the reader over this task's parts of the responses stage; returns the output manifest. ``judge``: a
    second model that says of each prediction whether it is right (its own request cache beside the reader's)."""
    from grtool.llm.stage_runner import Guard, ModelStage, Output
    from grtool.store.io import InputTable
    from grtool.store.schemas import ANSWERS
    from grtool.store.stage import StageSpec

    table = InputTable.open(responses, "responses")
    if table.source == "-":
        raise InputError("eval answer reads a `retrieve` output directory (its rows name their documents), not stdin")
    inputs = [str(table.source), str(corpus)]
    judging: dict[str, Backend] = {}

    def judge_rows(part: Any, out_rows: list[dict[str, Any]]) -> None:
        from grtool.llm.cache import CachedLLM

        if "backend" not in judging:
            judging["backend"] = judge()  # type: ignore[misc]
        llm = CachedLLM(judging["backend"], cache_dir / f"judge-{part.name}.sqlite" if cache_dir is not None else None)
        try:
            prompts = [judge_messages(r["question"], r["answers"], r["prediction"]) for r in out_rows]
            for row, gen in zip(out_rows, llm.generate(prompts, Sampling(temperature=0.0, max_tokens=4, seed=sampling.seed)) if prompts else []):
                row.update(judge_model=llm.model, judge_text=gen.text, judged_correct=verdict_of(gen.text))
                part.shard.count("judged_unclear", row["judged_correct"] is None)
        finally:
            llm.close()

    def part_fn(part: Any) -> None:
        rows = [r for batch in table.iter_part(part.index, columns=["qid", "sample", "doc_ids"]) for r in batch if r["sample"] == 0]
        gold = gold_answers(corpus, {r["qid"] for r in rows})
        answerable = [r for r in rows if r["qid"] in gold]  # unanswerable or unknown questions have nothing to score
        part.shard.count("questions_without_answer", len(rows) - len(answerable))
        rows = answerable
        part.shard.count_in(len(rows))
        documents = documents_by_id(corpus, {d for r in rows for d in r["doc_ids"] or ()})
        prompts = [reader_messages(gold[r["qid"]].question, [documents[d] for d in r["doc_ids"] or () if d in documents]) for r in rows]
        gens = part.llm.generate(prompts, sampling, on_progress=part.meter) if prompts else []
        out_rows = []
        for row, gen in zip(rows, gens):
            g = gold[row["qid"]]
            if gen.too_long is not None:
                part.shard.reject({"qid": g.qid, "dataset": g.dataset}, TOO_LONG, source=str(table.source), detail=gen.too_long)
                continue
            out_rows.append(answer_row(g, row["doc_ids"] or [], gen, part.llm.model))
            part.empty.add()
            if not out_rows[-1]["prediction"]:
                part.shard.count("answers_empty")
                part.empty.add_empty(None)
        if judge is not None:
            judge_rows(part, out_rows)
        part.shard.write_rows(out_rows)

    stage = ModelStage(
        "reading", "questions", [Output(out, StageSpec("answers", ANSWERS, params, inputs=inputs))], table.num_parts, backend, model_name,
        cache_dir=cache_dir, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index,
        guard=Guard(max_empty_share, "answers", "are empty"),
    )  # fmt: skip
    try:
        return stage.run(part_fn).manifests[0]
    finally:
        if hasattr(judging.get("backend"), "close"):
            judging["backend"].close()


def answer_row(gold: GoldAnswer, doc_ids: list[str], gen: Any, model: str) -> dict[str, Any]:
    prediction = prediction_of(gen.text)
    em, f1 = best_scores(prediction, gold.answers)
    return {
        "qid": gold.qid, "dataset": gold.dataset, "question": gold.question, "doc_ids": list(doc_ids), "text": gen.text,
        "prediction": prediction, "answers": list(gold.answers), "exact_match": em, "f1": f1, "tokens": gen.completion_tokens,
        "latency_ms": gen.latency_ms, "finish_reason": gen.finish_reason, "model": model, "judge_model": None, "judge_text": None, "judged_correct": None,
    }  # fmt: skip


def stage_predictions(out: str | Path):
    """The answers stage's rows as predictions, for the report (every part, all tasks')."""
    from grtool.evaluation.answers import Prediction
    from grtool.store.stage import iter_batches

    line = 0
    for batch in iter_batches(out, columns=["qid", "prediction", "judged_correct"]):
        for qid, prediction, judged in zip(*batch.to_pydict().values()):
            line += 1
            yield Prediction(line, qid, prediction or "", judged)
