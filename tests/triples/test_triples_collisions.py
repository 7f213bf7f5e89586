"""`grtool triples collisions` on a hand-computed table and on a real merged 2Wiki + MoreHopQA corpus."""

from __future__ import annotations

import json
from collections import defaultdict

import pyarrow.parquet as pq
from conftest import EXAMPLES

from PIL import Image

from grtool.store.schemas import DOCUMENTS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter
from grtool.triples.parse import render_docid


def _stage(path, table, schema, rows, params=None, inputs=()):
    stage = StageWriter(path, StageSpec(table, schema, params or {}, list(inputs)), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()


def _t(doc, idx, h, r, t):
    return {"doc_id": doc, "idx": idx, "head": h, "relation": r, "tail": t, "docid": render_docid((h, r, t))}


def test_collision_shares_are_exact(tmp_path, cli):
    run = tmp_path / "run"
    # d1, d2: hotpotqa; d3: 2wiki; d4: 2wiki and morehopqa (one paragraph shared by both datasets)
    _stage(run / "documents", "documents", DOCUMENTS, [
        {"doc_id": "d1", "title": "a", "text": "a", "datasets": ["hotpotqa"]},
        {"doc_id": "d2", "title": "b", "text": "b", "datasets": ["hotpotqa"]},
        {"doc_id": "d3", "title": "c", "text": "c", "datasets": ["2wikimultihopqa"]},
        {"doc_id": "d4", "title": "d", "text": "d", "datasets": ["2wikimultihopqa", "morehopqa"]},
    ])  # fmt: skip
    _stage(run / "triples", "triples", TRIPLES, [
        _t("d1", 0, "X", "is", "Y"), _t("d2", 0, "X", "is", "Y"), _t("d3", 0, "X", "is", "Y"),   # X in 3 docs
        _t("d1", 1, "P", "near", "Q"), _t("d4", 0, "P", "near", "Q"),                            # P in 2 docs
        _t("d1", 2, "only", "in", "d1"), _t("d2", 1, "only", "in", "d2"),
        _t("d3", 1, "only", "in", "d3"), _t("d4", 1, "only", "in", "d4"),
        _t("d3", 2, "R", "of", "S"), _t("d4", 2, "R", "of", "S"),                                # R in 2 docs
    ])  # fmt: skip
    plot = tmp_path / "c.png"
    report = json.loads(cli("triples", "collisions", run / "triples", "--json", "--plot", plot).stdout)
    assert report["view"] == "own"
    # 7 distinct docids; in >= 2 docs: X, P, R = 3; in >= 3 docs: X = 1
    assert report["distinct_triples"] == 7 and report["documents"] == 4
    assert report["share_in_2plus_docs"] == 3 / 7 and report["share_in_3plus_docs"] == 1 / 7
    assert report["docs_per_triple"] == {"1": 4, "2": 2, "3": 1}
    assert report["top_colliding"][0] == {"docid": render_docid(("X", "is", "Y")), "documents": 3}
    per = report["per_dataset"]
    # hotpotqa (d1, d2): X(2), P(1), only-d1, only-d2 -> 4 distinct, 1 in >= 2
    assert per["hotpotqa"]["distinct_triples"] == 4 and per["hotpotqa"]["share_in_2plus_docs"] == 1 / 4
    # 2wiki (d3, d4): X(1), P(1), R(2), only-d3, only-d4 -> 5 distinct, 1 in >= 2, 0 in >= 3
    assert per["2wikimultihopqa"]["distinct_triples"] == 5 and per["2wikimultihopqa"]["share_in_2plus_docs"] == 1 / 5
    assert per["2wikimultihopqa"]["share_in_3plus_docs"] == 0
    # morehopqa (d4): P, R, only-d4 -> 3 distinct, no collisions
    assert per["morehopqa"] == {"distinct_triples": 3, "in_2plus_docs": 0, "in_3plus_docs": 0, "share_in_2plus_docs": 0.0, "share_in_3plus_docs": 0.0}
    assert Image.open(plot).size[0] > 100

    # transitive: d4 joins 2wiki and morehopqa, so both rows are over d3 + d4: X, P, R(2), only-d3, only-d4
    reach = json.loads(cli("triples", "collisions", run / "triples", "--json", "--view", "transitive").stdout)
    assert reach["view"] == "transitive" and reach["per_dataset"]["hotpotqa"] == per["hotpotqa"]
    assert reach["per_dataset"]["morehopqa"] == reach["per_dataset"]["2wikimultihopqa"] == per["2wikimultihopqa"]
    assert reach["reaches"] == {"hotpotqa": ["hotpotqa"], "2wikimultihopqa": ["2wikimultihopqa", "morehopqa"], "morehopqa": ["2wikimultihopqa", "morehopqa"]}

    # The run directory works too, and the table goes to stderr without --json.
    text = cli("triples", "collisions", run)
    assert "42.86%" in text.stderr and "hotpotqa" in text.stderr


def test_collisions_without_documents_table(tmp_path, cli):
    _stage(tmp_path / "t", "triples", TRIPLES, [_t("d1", 0, "A", "b", "C"), _t("d2", 0, "A", "b", "C")])
    report = json.loads(cli("triples", "collisions", tmp_path / "t", "--json").stdout)
    assert report["share_in_2plus_docs"] == 1.0 and report["per_dataset"] == {} and report["corpus"] is None
    missing = cli("triples", "collisions", tmp_path / "nope", check=2)
    assert "nope" in missing.stderr


def _parquet_rows(stage):
    return [r for f in sorted(stage.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _expected(triples, docs):
    """The report's shares over the triples of ``docs``, counted by hand."""
    holders = defaultdict(set)
    for t in triples:
        if t["doc_id"] in docs:
            holders[t["docid"]].add(t["doc_id"])
    n = len(holders)
    two, three = sum(len(h) >= 2 for h in holders.values()), sum(len(h) >= 3 for h in holders.values())
    return {"distinct_triples": n, "in_2plus_docs": two, "in_3plus_docs": three, "share_in_2plus_docs": two / n, "share_in_3plus_docs": three / n}


def test_merged_corpus_transitive_rows_cover_the_reachable_documents(cli, tmp_path):
    """MoreHopQA's questions reach 2Wiki's documents after `corpus merge`: its transitive row counts them (the
    default own view does not)."""
    root = EXAMPLES
    for name in ("2wikimultihopqa", "morehopqa"):
        cli("corpus", "ingest", root / name, "--out", tmp_path / name)
    run = tmp_path / "merged"
    cli("corpus", "merge", tmp_path / "2wikimultihopqa", tmp_path / "morehopqa", "--out", run)
    documents = _parquet_rows(run / "documents")
    own = {name: {d["doc_id"] for d in documents if name in d["datasets"]} for name in ("2wikimultihopqa", "morehopqa")}
    # One triple per document keyed by its title: documents of one title (both datasets hold some) collide.
    triples = [_t(d["doc_id"], 0, d["title"], "is the title of", "a Wikipedia article") for d in documents]
    triples += [_t(d["doc_id"], 1, d["doc_id"], "is", "unique") for d in documents]
    _stage(tmp_path / "triples", "triples", TRIPLES, triples, inputs=[str(run / "documents")])

    reach = json.loads(cli("triples", "collisions", tmp_path / "triples", "--json", "--view", "transitive").stdout)
    assert reach["corpus"] == str(run / "documents")
    every = own["2wikimultihopqa"] | own["morehopqa"]
    assert reach["reaches"]["morehopqa"] == reach["reaches"]["2wikimultihopqa"] == ["2wikimultihopqa", "morehopqa"]
    assert reach["per_dataset"]["morehopqa"] == reach["per_dataset"]["2wikimultihopqa"] == _expected(triples, every)
    assert reach["per_dataset"]["morehopqa"]["distinct_triples"] > len(own["morehopqa"])

    mine = json.loads(cli("triples", "collisions", tmp_path / "triples", "--json").stdout)
    assert mine["view"] == "own"
    for name, docs in own.items():
        assert mine["per_dataset"][name] == _expected(triples, docs)
    assert mine["per_dataset"]["morehopqa"] != reach["per_dataset"]["morehopqa"]
    table = cli("triples", "collisions", tmp_path / "triples", "--view", "transitive").stderr
    assert "transitive" in table and "2wikimultihopqa, morehopqa" in table


def test_default_rows_count_where_documents_came_from(cli, tmp_path):
    """Issue #26: a merge where a few shared paragraphs join the datasets printed identical rows for every
    dataset although every triple came from one of them. By default a row counts the documents that dataset
    brought (a shared paragraph counts for each dataset that holds it); the transitive view is asked for."""
    for name in ("hotpotqa", "morehopqa", "musique"):  # the dev/test files: the train examples share paragraphs
        cli("corpus", "ingest", *sorted(f for f in (EXAMPLES / name).iterdir() if "train" not in f.name), "--out", tmp_path / name)
    run = tmp_path / "merged"
    cli("corpus", "merge", *(tmp_path / n for n in ("hotpotqa", "morehopqa", "musique")), "--out", run)
    documents = _parquet_rows(run / "documents")
    own = {n: {d["doc_id"] for d in documents if n in d["datasets"]} for n in ("hotpotqa", "morehopqa", "musique")}
    shared = own["hotpotqa"] & own["morehopqa"]
    assert shared and own["morehopqa"] & own["musique"] and not own["hotpotqa"] & own["musique"]
    # triples only for HotpotQA's documents, as when only one dataset went through `triples extract`
    hotpot = sorted(own["hotpotqa"])
    triples = [_t(d, 0, "Opera", "is in", "Sydney") for d in hotpot[:3]]
    triples += [_t(d, 1, d, "is", "unique") for d in hotpot]
    _stage(tmp_path / "triples", "triples", TRIPLES, triples, inputs=[str(run / "documents")])

    report = json.loads(cli("triples", "collisions", tmp_path / "triples", "--json").stdout)
    assert report["view"] == "own"
    assert report["per_dataset"]["hotpotqa"] == _expected(triples, own["hotpotqa"])
    assert report["per_dataset"]["morehopqa"] == _expected(triples, shared)  # only the paragraphs it shares
    assert "musique" not in report["per_dataset"]  # none of its documents has a triple
    assert report["reaches"]["morehopqa"] == ["morehopqa"]

    joined = json.loads(cli("triples", "collisions", tmp_path / "triples", "--json", "--view", "transitive").stdout)
    group = ["hotpotqa", "morehopqa", "musique"]  # MoreHopQA's shared paragraphs join all three
    assert all(joined["reaches"][n] == group for n in group)
    assert joined["per_dataset"]["musique"] == joined["per_dataset"]["morehopqa"] == report["per_dataset"]["hotpotqa"]
