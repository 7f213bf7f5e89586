"""`grtool corpus stats`: the dataset table of a paper, per dataset and split.

Hops come from ``meta.hops``, which ingest fills per dataset: HotpotQA the number of supporting-fact
titles, 2Wiki the length of ``evidences``, MuSiQue the length of ``question_decomposition``, MoreHopQA its
``no_of_hops``. Documents are counted per dataset (a document lists every dataset whose files contain it);
``gold documents`` counts the distinct gold documents of a split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
from rich.table import Table

from grtool.corpus.datasets import gold_incomplete_expr
from grtool.errors import InputError
from grtool.log import lines
from grtool.store.reading import collect, scan_shards
from grtool.store.records import is_stage_dir, load_manifest, resolve_stage
from grtool.store.stage import shard_paths
import msgspec
from grtool.records import Report


def _stage(directory: Path, table: str) -> Path | None:
    """The ``table`` stage at or in ``directory`` through the one resolver (a killed or failed stage is refused, as
    any command's input: its numbers would pass for the corpus's); None when there is none."""
    if not is_stage_dir(directory / table) and not (is_stage_dir(directory) and load_manifest(directory).table == table):
        return None
    return resolve_stage(directory, table)


def _scan(shards: list[Path]) -> pl.LazyFrame:
    return scan_shards(shards)


def corpus_stats(directory: str | Path) -> dict[str, Any]:
    directory = Path(directory)
    q_stage, d_stage = _stage(directory, "questions"), _stage(directory, "documents")
    if q_stage is None and d_stage is None:
        raise InputError(f"{directory}: no questions/ or documents/ stage directory here")
    result: dict[str, Any] = {"path": str(directory), "groups": [], "documents": {}}

    d_shards = shard_paths(d_stage) if d_stage is not None else []
    if d_shards:
        docs = _scan(d_shards)
        result["documents"]["total"] = collect(docs.select(pl.len()), d_shards).item()
        by_ds = collect(docs.select(pl.col("datasets").alias("dataset")).explode("dataset").group_by("dataset").agg(pl.len()), d_shards)
        result["documents"]["by_dataset"] = {r["dataset"]: r["len"] for r in by_ds.sort("dataset").iter_rows(named=True)}

    q_shards = shard_paths(q_stage) if q_stage is not None else []
    if q_shards:
        q = _scan(q_shards).select(
            "dataset",
            "split",
            "answerable",
            pl.col("gold_doc_ids").list.len().alias("gold"),
            pl.col("meta").str.json_path_match("$.hops").cast(pl.Int64, strict=False).alias("hops"),
            "gold_doc_ids",
            # HotpotQA fullwiki: supporting-fact titles absent from the retrieved context (gold is partial)
            gold_incomplete_expr().alias("gold_incomplete"),
        )
        groups = collect(
            q.group_by("dataset", "split")
            .agg(
                pl.len().alias("questions"),
                pl.col("answerable").cast(pl.Float64).mean().alias("answerable_share"),
                pl.col("gold").mean().alias("gold_mean"),
                pl.col("gold").min().alias("gold_min"),
                pl.col("gold").max().alias("gold_max"),
                pl.col("gold_doc_ids").list.explode().drop_nulls().n_unique().alias("gold_documents"),
                pl.col("gold_incomplete").sum().alias("gold_incomplete"),
            )
            .sort("dataset", "split"),
            q_shards,
        )
        hops = collect(q.group_by("dataset", "split", "hops").agg(pl.len().alias("n")), q_shards)
        hop_map: dict[tuple[str, str], dict[str, int]] = {}
        for r in hops.sort("hops", nulls_last=True).iter_rows(named=True):
            key = "unknown" if r["hops"] is None else str(r["hops"])
            hop_map.setdefault((r["dataset"], r["split"]), {})[key] = r["n"]
        by_ds = result["documents"].get("by_dataset", {})
        for r in groups.iter_rows(named=True):
            result["groups"].append(
                {
                    "dataset": r["dataset"],
                    "split": r["split"],
                    "questions": r["questions"],
                    "documents": by_ds.get(r["dataset"]),
                    "gold_documents": r["gold_documents"],
                    "gold_per_question": {"mean": r["gold_mean"], "min": r["gold_min"], "max": r["gold_max"]},
                    "hops": hop_map.get((r["dataset"], r["split"]), {}),
                    "answerable_share": r["answerable_share"],
                    "questions_with_incomplete_gold": int(r["gold_incomplete"] or 0),
                }
            )
        result["questions_total"] = int(groups["questions"].sum()) if groups.height else 0
    return result


def stats_table(stats: dict[str, Any]) -> Table:
    t = Table(title=f"corpus {stats['path']}")
    for col in ("dataset", "split", "questions", "documents", "gold docs", "gold/question mean (min–max)", "hops", "answerable"):
        t.add_column(col, justify="left" if col in ("dataset", "split", "hops") else "right")
    for g in stats["groups"]:
        gq = g["gold_per_question"]
        hops = ", ".join(f"{h}: {n}" for h, n in g["hops"].items())
        t.add_row(
            g["dataset"],
            g["split"],
            f"{g['questions']:,}",
            "" if g["documents"] is None else f"{g['documents']:,}",
            f"{g['gold_documents']:,}",
            f"{gq['mean']:.2f} ({gq['min']}–{gq['max']})",
            hops,
            f"{g['answerable_share']:.1%}",
        )
    caption = []
    docs = stats.get("documents", {})
    if docs:
        by = ", ".join(f"{k}: {v:,}" for k, v in docs.get("by_dataset", {}).items())
        caption.append(f"{docs.get('total', 0):,} distinct documents ({by}); 'documents' counts the dataset's whole corpus")
    incomplete = [f"{g['dataset']} {g['split']}: {g['questions_with_incomplete_gold']:,}" for g in stats["groups"] if g["questions_with_incomplete_gold"]]
    if incomplete:
        caption.append("questions whose gold titles are missing from their context (meta.gold_titles_missing): " + ", ".join(incomplete))
    t.caption = lines(caption) if caption else None
    return t


def plot_stats(stats: dict[str, Any], path: str | Path) -> None:
    """Two panels: hop distribution and gold documents per question, one bar group per dataset/split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = stats["groups"]
    labels = [f"{g['dataset']}\n{g['split']}" for g in groups]
    hop_keys = sorted({h for g in groups for h in g["hops"]}, key=lambda h: (h == "unknown", int(h) if h.isdigit() else 0))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) + 4), 4.5))
    width = 0.8 / max(1, len(hop_keys))
    for i, h in enumerate(hop_keys):
        shares = [g["hops"].get(h, 0) / g["questions"] if g["questions"] else 0 for g in groups]
        left.bar([x + i * width for x in range(len(groups))], shares, width, label=f"{h} hops")
    left.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], labels, fontsize=8)
    left.set_ylabel("share of questions")
    left.set_title("hop distribution")
    left.legend(fontsize=8)
    means = [g["gold_per_question"]["mean"] or 0 for g in groups]
    lo = [m - (g["gold_per_question"]["min"] or 0) for m, g in zip(means, groups)]
    hi = [(g["gold_per_question"]["max"] or 0) - m for m, g in zip(means, groups)]
    right.bar(range(len(groups)), means, yerr=[lo, hi], capsize=4, color="tab:gray")
    right.set_xticks(range(len(groups)), labels, fontsize=8)
    right.set_ylabel("gold documents per question (mean, min–max)")
    right.set_title("gold documents")
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # the path its caller's claim gives (grtool.store.partloop.claim_file)
    plt.close(fig)


class StatsReport(Report, kw_only=True):
    """``corpus stats --json``: per dataset and split (``groups``), the documents, and the gold coverage where the
    run holds triples."""

    path: str
    groups: list[dict[str, Any]]
    documents: dict[str, Any]
    questions_total: int | msgspec.UnsetType = msgspec.UNSET  # a run without a questions stage has none
    coverage: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
