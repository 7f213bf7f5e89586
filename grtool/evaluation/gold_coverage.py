"""Gold coverage: the share of gold documents that hold at least one docid, per dataset and split.

A gold document none of whose triples was extracted (or made it into the index) can never be retrieved: a
question whose gold documents all lack a docid has recall 0 by construction, whatever the model does, and one
with some of them lacking has its recall capped. :func:`gold_coverage` is the one place this is counted (DESIGN
§8); `corpus stats --triples/--index`, `index stats --corpus`, `retrieve`, `eval recall`, `validate` and
`grtool report` ask it and show its answer (the ``coverage`` object of their JSON). The documents that hold a
docid are read from a triples stage (its ``doc_id`` column) or from an index (the documents its sequences map
to: ``doc_ids.txt`` through ``seq_docs``).

Counted are the questions whose responses `eval recall` scores: answerable, with gold documents, the gold set
complete (:func:`grtool.evaluation.recall.scorable`). ``gold_documents`` counts distinct documents per dataset and
split, as `corpus stats` does.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grtool.index.base import Index

EXAMPLES = 5  # unreachable questions named per dataset and split
FIX = "extract triples for their documents (`grtool triples extract`) and rebuild the index"


def gold_coverage(corpus: str | Path, holders: "str | Path | Index", qids: Collection[str] | None = None) -> dict[str, Any]:
    """Coverage of the gold documents of ``corpus`` (a run directory or its questions stage) by the documents
    that hold a docid in ``holders`` (a triples stage, a run directory holding triples/, or an open
    :class:`~grtool.index.base.Index`); only the questions ``qids`` when given.

    The answer (the ``coverage`` object every route prints): ``source``, totals (``questions``,
    ``gold_documents``, ``reachable``, ``unreachable``, ``share``, ``unreachable_questions``) and ``splits``, the
    same per dataset and split with ``unreachable_examples`` (qids whose gold documents all lack a docid)."""
    import polars as pl

    from grtool.store.records import resolve_stage

    held, source = _held_doc_ids(holders)
    gold = _gold_documents(resolve_stage(corpus, "questions"), qids)
    gold = gold.with_columns(reached=pl.col("doc_id").is_in(pl.from_arrow(held).cast(pl.String)))
    per_question = gold.group_by("qid", "dataset", "split").agg(pl.col("reached").any())
    unreachable = per_question.filter(~pl.col("reached")).sort("qid")
    keys = ["dataset", "split"]
    groups = (
        gold.group_by(keys)
        .agg(pl.col("doc_id").n_unique().alias("gold_documents"), pl.col("doc_id").filter(pl.col("reached")).n_unique().alias("reachable"))
        .join(per_question.group_by(keys).len("questions"), on=keys)
        .join(unreachable.group_by(keys).agg(pl.len().alias("unreachable_questions"), pl.col("qid").head(EXAMPLES).alias("unreachable_examples")), on=keys, how="left")
        .sort(keys)
    )
    splits = [
        {
            "dataset": g["dataset"],
            "split": g["split"],
            **_counts(g["questions"], g["gold_documents"], g["reachable"], g["unreachable_questions"] or 0),
            "unreachable_examples": g["unreachable_examples"] or [],
        }  # fmt: skip
        for g in groups.iter_rows(named=True)
    ]
    # distinct documents over the whole selection: a document gold in two splits counts once
    reachable = gold.filter(pl.col("reached")).select(pl.col("doc_id").n_unique()).item()
    totals = _counts(per_question.height, gold.select(pl.col("doc_id").n_unique()).item(), reachable, unreachable.height)
    return {"source": source, **totals, "splits": splits}


def _counts(questions: int, gold_documents: int, reachable: int, unreachable_questions: int) -> dict[str, Any]:
    return {"questions": questions, "gold_documents": gold_documents, "reachable": reachable, "unreachable": gold_documents - reachable,
            "share": reachable / gold_documents if gold_documents else None, "unreachable_questions": unreachable_questions}  # fmt: skip


def _gold_documents(questions: Path, qids: Collection[str] | None):
    """(qid, dataset, split, doc_id): one row per gold document of each counted question."""
    import polars as pl

    from grtool.corpus.datasets import gold_incomplete_expr
    from grtool.store.stage import iter_batches

    scorable = (pl.col("gold_doc_ids").list.len() > 0) & pl.col("answerable").fill_null(True) & ~gold_incomplete_expr().fill_null(False)
    if qids is not None:
        scorable = scorable & pl.col("qid").is_in(pl.Series(sorted(qids), dtype=pl.String))
    frames = [
        pl.from_arrow(batch).filter(scorable).select("qid", "dataset", pl.col("split").fill_null("unknown"), pl.col("gold_doc_ids").alias("doc_id"))
        for batch in iter_batches(questions, ["qid", "dataset", "split", "gold_doc_ids", "answerable", "meta"])
    ]
    empty = pl.DataFrame(schema={"qid": pl.String, "dataset": pl.String, "split": pl.String, "doc_id": pl.List(pl.String)})
    table = pl.concat([empty, *frames], how="vertical_relaxed") if frames else empty
    return table.explode("doc_id").drop_nulls("doc_id")


def _held_doc_ids(holders: "str | Path | Index"):
    """(the distinct documents that hold a docid, as an Arrow array; what they were read from)."""
    from grtool.index.base import Index

    if isinstance(holders, Index):
        return holders.held_doc_ids(), f"index {holders.path}"
    from grtool.store.coverage import triples_doc_ids
    from grtool.store.records import resolve_stage

    stage = resolve_stage(holders, "triples")
    return triples_doc_ids(stage), f"triples {stage}"


def triples_of_corpus(questions: str | Path) -> Path | None:
    """The triples stage of a run laid out as the pipelines write it: ``triples/`` beside the questions stage
    (a run directory holding both) or beside its corpus directory (``out/corpus/questions`` and ``out/triples``);
    None when neither is there (or its record cannot be read: `validate` names that stage itself)."""
    from grtool.errors import GrtoolError
    from grtool.store.records import is_stage_dir, load_manifest

    corpus = Path(questions).parent
    for candidate in (corpus / "triples", corpus.parent / "triples"):
        try:
            if is_stage_dir(candidate) and load_manifest(candidate).table == "triples":
                return candidate
        except GrtoolError:
            continue
    return None


# ------------------------------------------------------------------------------------------------ showing it


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def coverage_warning(coverage: dict[str, Any]) -> str | None:
    """One line when a gold document holds no docid (None at full coverage): how many documents and questions,
    where, and the fix."""
    if not coverage["unreachable"]:
        return None
    where = ", ".join(f"{s['dataset']} {s['split']}: {s['unreachable']} of {s['gold_documents']}" for s in coverage["splits"] if s["unreachable"])
    examples = [q for s in coverage["splits"] for q in s["unreachable_examples"]][:EXAMPLES]
    questions = (f"{coverage['unreachable_questions']} of {coverage['questions']} questions have no gold document with a docid "
                 f"(recall 0 by construction, e.g. {', '.join(examples)})" if examples else
                 f"no question of the {coverage['questions']} lacks all its gold documents, some have their recall capped")  # fmt: skip
    return (f"gold coverage {_share(coverage['share'])}: {coverage['unreachable']} of {coverage['gold_documents']} gold documents "
            f"hold no docid in {coverage['source']} ({where}); {questions}; {FIX}")  # fmt: skip


def coverage_rows(coverage: dict[str, Any]) -> list[list[Any]]:
    """One row per dataset and split, then the total: dataset, split, questions, gold documents, with a docid,
    share, questions with none."""
    rows = [[s["dataset"], s["split"], s["questions"], s["gold_documents"], s["reachable"], _share(s["share"]), s["unreachable_questions"]]
            for s in coverage["splits"]]  # fmt: skip
    c = coverage
    return rows + [["all", "", c["questions"], c["gold_documents"], c["reachable"], _share(c["share"]), c["unreachable_questions"]]]


COVERAGE_HEADERS = ["dataset", "split", "questions", "gold documents", "with a docid", "share", "questions with none"]


def coverage_table(coverage: dict[str, Any]):
    """The rows of :func:`coverage_rows` as a Rich table, titled with where the docids come from."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"gold coverage by {coverage['source']}"))
    for i, col in enumerate(COVERAGE_HEADERS):
        table.add_column(col, justify="left" if i < 2 else "right")
    for row in coverage_rows(coverage):
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row), style="bold" if row[0] == "all" else None)
    return table
