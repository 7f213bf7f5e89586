"""A small real run without a model, for tests that damage one (tests/store/test_damaged_files.py, the fuzzer)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path

from conftest import EXAMPLES, run_cli


def write_stage(path: Path, table: str, schema, rows: list[dict]) -> None:
    from grtool.store.stage import StageSpec, StageWriter

    stage = StageWriter(path, StageSpec(table, schema), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()


def _docid(h: str, r: str, t: str) -> str:
    return f"<docid_start>{h}, {r}, {t}<docid_end>"


def write_small_run(
    run: Path, responses: Path, without: Callable[[list[dict]], Collection[str]] | None = None, sources: tuple[Path, ...] = (EXAMPLES / "2wikimultihopqa", EXAMPLES / "musique")
) -> list[dict]:
    """`corpus ingest` of ``sources`` (two bundled example datasets by default) into ``run``, then a triples stage
    (one triple per document, none for the doc_ids ``without`` picks from the questions) and a chains stage (one
    chain per question, citing its gold documents' triples) written by the stage writer, and ``responses`` (JSON
    Lines) that answer every question with its chain. Returns the triples."""
    from grtool.store.schemas import CHAINS, TRIPLES
    from grtool.store.stage import read_table

    run_cli("corpus", "ingest", *sources, "--out", run)
    documents = read_table(run / "documents").to_pylist()
    questions = read_table(run / "questions").to_pylist()
    dropped = set(without(questions)) if without is not None else set()
    triples = [
        {"doc_id": d["doc_id"], "idx": 0, "head": d["title"], "relation": "described in", "tail": f"paragraph {i}",
         "docid": _docid(d["title"], "described in", f"paragraph {i}")}
        for i, d in enumerate(documents)
        if d["doc_id"] not in dropped
    ]  # fmt: skip
    write_stage(run / "triples", "triples", TRIPLES, triples)
    by_doc = {t["doc_id"]: t for t in triples}
    chains, answers = [], []
    for q in questions:
        docids = [by_doc[d]["docid"] for d in q["gold_doc_ids"] if d in by_doc]
        text = "I look it up. " + " ".join(docids) + f" So the answer is {q['answer']}."
        chains.append({"qid": q["qid"], "candidate": 0, "text": text, "docids": docids, "flipped": [False] * len(docids),
                       "selected": True, "score": 1.0, "model": "test", "temperature": 0.0, "finish_reason": "stop"})  # fmt: skip
        answers.append({"qid": q["qid"], "response": text})
    write_stage(run / "chains", "chains", CHAINS, chains)
    responses.write_text("".join(json.dumps(r) + "\n" for r in answers))
    return triples
