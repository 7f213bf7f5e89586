"""`triples collisions`: how often one docid string is found in several documents (it then retrieves all of them).

Counted over distinct docid strings: a docid is "in ≥ k documents" when at least k distinct doc_ids produced it.
Per dataset there are two views. ``own`` (the default): a dataset's row counts the documents it brought, i.e.
the documents whose ``datasets`` list it; a paragraph that several datasets share (``corpus merge`` unites
their ``datasets``) counts for each of them, and for nothing further. ``transitive``: a dataset's row counts
the documents its questions can reach in a merged corpus, i.e. the documents of every dataset joined to it,
where two datasets are joined when they share a document or when one's questions were built from the other
(MoreHopQA's ``meta.source_dataset``), transitively; so MoreHopQA's row is over 2Wiki's documents too, and a
handful of shared paragraphs can make every row of a four-dataset merge the same. The document → datasets map
comes from the documents table (``--corpus``, else the input recorded in the triples manifest, else a
``documents/`` stage beside the triples); the source links from the ``questions/`` stage beside it, when
there is one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import polars as pl

from grtool.errors import GrtoolError, InputError
from grtool.store.coverage import check_triples_cover
from grtool.store.reading import collect, scan_shards
from grtool.store.stage import iter_batches, shard_paths
from grtool.store.records import load_manifest, resolve_stage
from grtool.triples.grounding import drop_shares
from grtool.records import Report

VIEWS = ("own", "transitive")  # the first is the default


def find_documents(triples_stage: Path, corpus: str | Path | None) -> Path | None:
    if corpus is not None:
        return resolve_stage(corpus, "documents")
    candidates = [Path(i.path) for i in load_manifest(triples_stage).inputs if i.kind == "stage"]
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


def _source_links(docs: Path) -> set[tuple[str, str]]:
    """(dataset, dataset its questions were built from) pairs from the questions stage beside the documents."""
    try:
        questions = resolve_stage(docs.parent, "questions")
    except InputError:
        return set()
    links: set[tuple[str, str]] = set()
    for batch in iter_batches(questions, ["dataset", "meta"]):
        for dataset, meta in zip(batch.column("dataset").to_pylist(), batch.column("meta").to_pylist()):
            source = orjson.loads(meta).get("source_dataset") if meta else None
            if isinstance(source, str) and source != dataset:
                links.add((dataset, source))
    return links


def reach_groups(datasets: pl.DataFrame, links: set[tuple[str, str]]) -> dict[str, str]:
    """dataset → the name of its joined group (union-find over shared documents and source links)."""
    parent = {d: d for d in datasets["dataset"].unique().to_list()}

    def root(d: str) -> str:
        while parent[d] != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    def union(a: str, b: str) -> None:
        if a in parent and b in parent:  # a source absent from this corpus joins nothing
            ra, rb = sorted((root(a), root(b)))
            parent[rb] = ra

    shared = datasets.group_by("doc_id").agg(pl.col("dataset").unique().sort()).filter(pl.col("dataset").list.len() > 1)
    for names in {tuple(n) for n in shared["dataset"].to_list()}:
        for other in names[1:]:
            union(names[0], other)
    for a, b in sorted(links):
        union(a, b)
    members: dict[str, list[str]] = {}
    for d in sorted(parent):
        members.setdefault(root(d), []).append(d)
    return {d: "+".join(members[root(d)]) for d in parent}


def collision_stats(triples: str | Path, corpus: str | Path | None = None, top: int = 20, view: str = VIEWS[0]) -> dict[str, Any]:
    if view not in VIEWS:
        raise InputError(f"--view {view!r}: expected one of {', '.join(VIEWS)}")
    stage = resolve_stage(triples, "triples")
    if corpus is not None:
        check_triples_cover(stage, corpus)
    shards = [str(p) for p in shard_paths(stage)]
    if not shards:
        raise GrtoolError(f"{stage}: no finished shards yet")
    rows = scan_shards(shards).select("doc_id", "docid")
    counts = collect(rows.group_by("docid").agg(pl.col("doc_id").n_unique().alias("n")), [Path(s) for s in shards])
    report: dict[str, Any] = {"triples": str(stage), **_shares(counts)}
    report["documents"] = int(rows.select(pl.col("doc_id").n_unique()).collect().item())
    report["dropped"] = drop_shares(load_manifest(stage).counters)  # triples extract's checks, per reason
    report["docs_per_triple"] = {str(k): int(v) for k, v in counts.group_by("n").len().sort("n").iter_rows()}
    report["top_colliding"] = [{"docid": d, "documents": int(n)} for d, n in counts.filter(pl.col("n") >= 2).sort(["n", "docid"], descending=[True, False]).head(top).iter_rows()]
    docs = find_documents(stage, corpus)
    report["corpus"] = str(docs) if docs is not None else None
    report["view"] = view
    report["per_dataset"] = {}
    report["reaches"] = {}
    if docs is not None:
        datasets = scan_shards(shard_paths(docs)).select("doc_id", pl.col("datasets").alias("dataset")).explode("dataset").drop_nulls("dataset").unique().collect()
        groups = reach_groups(datasets, _source_links(docs)) if view == "transitive" else {d: d for d in datasets["dataset"].unique().to_list()}
        scoped = datasets.with_columns(pl.col("dataset").replace_strict(groups).alias("scope")).select("doc_id", "scope").unique()
        per = rows.join(scoped.lazy(), on="doc_id", how="inner").group_by("scope", "docid").agg(pl.col("doc_id").n_unique().alias("n")).collect()
        by_scope = {name: _shares(group) for (name,), group in per.group_by("scope")}
        for name in sorted(groups):
            if groups[name] in by_scope:
                report["per_dataset"][name] = by_scope[groups[name]]
                report["reaches"][name] = groups[name].split("+")
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


class CollisionsReport(Report, kw_only=True):
    """``triples collisions --json``."""

    triples: str
    distinct_triples: int
    in_2plus_docs: int
    in_3plus_docs: int
    share_in_2plus_docs: float | None
    share_in_3plus_docs: float | None
    documents: int
    dropped: dict[str, Any]
    docs_per_triple: dict[str, int]
    top_colliding: list[dict[str, Any]]
    corpus: str | None
    view: str
    per_dataset: dict[str, Any]
    reaches: dict[str, Any]
