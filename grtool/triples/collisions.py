"""`triples collisions`: how often one docid string is found in several documents (it then retrieves all of them).

Counted over distinct docid strings: a docid is "in ≥ k documents" when at least k distinct doc_ids produced it.
Per dataset, only the documents of that dataset count (a document may belong to several datasets, e.g. a
paragraph shared by 2WikiMultihopQA and MoreHopQA); the document → datasets map comes from the documents table
(``--corpus``, else the input recorded in the triples manifest, else a ``documents/`` stage beside the triples).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from grtool.errors import GrtoolError, InputError
from grtool.store.stage import load_manifest, resolve_stage, shard_paths


def find_documents(triples_stage: Path, corpus: str | Path | None) -> Path | None:
    if corpus is not None:
        return resolve_stage(corpus, "documents")
    candidates = [Path(i["path"]) for i in load_manifest(triples_stage).get("inputs", []) if i.get("kind") == "stage"]
    candidates.append(triples_stage.parent / "documents")
    for c in candidates:
        try:
            return resolve_stage(c, "documents")
        except InputError:
            continue
    return None


def _shares(counts: pl.DataFrame) -> dict[str, Any]:
    n = counts.height
    two = int((counts["n"] >= 2).sum()) if n else 0
    three = int((counts["n"] >= 3).sum()) if n else 0
    return {
        "distinct_triples": n,
        "in_2plus_docs": two,
        "in_3plus_docs": three,
        "share_in_2plus_docs": two / n if n else 0.0,
        "share_in_3plus_docs": three / n if n else 0.0,
    }


def collision_stats(triples: str | Path, corpus: str | Path | None = None, top: int = 20) -> dict[str, Any]:
    stage = resolve_stage(triples, "triples")
    shards = [str(p) for p in shard_paths(stage)]
    if not shards:
        raise GrtoolError(f"{stage}: no finished shards yet")
    rows = pl.scan_parquet(shards).select("doc_id", "docid")
    counts = rows.group_by("docid").agg(pl.col("doc_id").n_unique().alias("n")).collect()
    report: dict[str, Any] = {"triples": str(stage), **_shares(counts)}
    report["documents"] = int(rows.select(pl.col("doc_id").n_unique()).collect().item())
    report["docs_per_triple"] = {
        str(k): int(v) for k, v in counts.group_by("n").len().sort("n").iter_rows()
    }
    report["top_colliding"] = [
        {"docid": d, "documents": int(n)} for d, n in counts.filter(pl.col("n") >= 2).sort(["n", "docid"], descending=[True, False]).head(top).iter_rows()
    ]
    docs = find_documents(stage, corpus)
    report["corpus"] = str(docs) if docs is not None else None
    report["per_dataset"] = {}
    if docs is not None:
        datasets = (
            pl.scan_parquet([str(p) for p in shard_paths(docs)])
            .select("doc_id", pl.col("datasets").alias("dataset"))
            .explode("dataset")
            .drop_nulls("dataset")
            .unique()
        )
        per = (
            rows.join(datasets, on="doc_id", how="inner")
            .group_by("dataset", "docid")
            .agg(pl.col("doc_id").n_unique().alias("n"))
            .collect()
        )
        for (name,), group in sorted(per.group_by("dataset"), key=lambda g: g[0][0]):
            report["per_dataset"][name] = _shares(group)
    return report


def plot_docs_per_triple(report: dict[str, Any], path: str | Path) -> None:
    """Bar chart: distinct triples by how many documents each was found in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets: dict[str, int] = {}
    for k, v in report["docs_per_triple"].items():
        label = k if int(k) < 10 else "10+"
        buckets[label] = buckets.get(label, 0) + v
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(list(buckets), list(buckets.values()), color="#4c72b0")
    ax.set_yscale("log")
    ax.set_xlabel("documents the triple is found in")
    ax.set_ylabel("distinct triples (log scale)")
    ax.set_title(f"{report['distinct_triples']:,} triples; {report['share_in_2plus_docs']:.2%} in ≥2 documents")
    fig.tight_layout()
    fig.savefig(str(path), dpi=120)
    plt.close(fig)
