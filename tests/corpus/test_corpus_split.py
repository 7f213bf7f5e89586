"""`grtool corpus split` (#48): train/dev/test by ratio for data that came without splits, stable by a hash of the
qid, written as a new corpus (documents as they were); data that has splits is refused unless --resplit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from grtool.corpus.ingest import ingest
from grtool.corpus.split import split_of
from grtool.store.stage import read_table


def _splits(corpus: Path) -> dict[str, str]:
    return {r["qid"]: r["split"] for r in read_table(corpus / "questions", ["qid", "split"]).to_pylist()}


def test_split_by_ratio_is_stable_when_questions_are_added(examples, tmp_path, cli):
    source = examples / "inline" / "qa.jsonl"
    lines = source.read_text().splitlines()
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(lines[:7]) + "\n")
    ingest([source], tmp_path / "all")
    ingest([fewer], tmp_path / "fewer")
    assert set(_splits(tmp_path / "all").values()) == {"unknown"}

    proc = cli("corpus", "split", tmp_path / "all", "--ratios", "0.8,0.1,0.1", "--out", tmp_path / "all-split", "--json")
    report = json.loads(proc.stdout)
    splits = _splits(tmp_path / "all-split")
    assert report["by_split"] == dict(Counter(splits.values())) and report["questions"] == len(lines)
    assert splits == {q: split_of(q, (0.8, 0.1, 0.1), ("train", "dev", "test"), 0) for q in splits}
    assert set(splits.values()) == {"train", "dev", "test"}  # the bundled file's 12 questions fill every split
    cli("corpus", "split", tmp_path / "fewer", "--ratios", "0.8,0.1,0.1", "--out", tmp_path / "fewer-split")
    fewer_splits = _splits(tmp_path / "fewer-split")
    assert fewer_splits == {q: splits[q] for q in fewer_splits}  # a question keeps its split when others are added

    # the documents as they were; every other column of the questions as it was
    before, after = read_table(tmp_path / "all" / "documents"), read_table(tmp_path / "all-split" / "documents")
    assert after.to_pylist() == before.to_pylist()
    old = {r["qid"]: {**r, "split": None} for r in read_table(tmp_path / "all" / "questions").to_pylist()}
    assert {r["qid"]: {**r, "split": None} for r in read_table(tmp_path / "all-split" / "questions").to_pylist()} == old
    cli("validate", tmp_path / "all-split")

    # another seed, another split; names for two ratios
    cli("corpus", "split", tmp_path / "all", "--ratios", "0.5,0.5", "--names", "train,held", "--seed", "3", "--out", tmp_path / "halves")
    assert set(_splits(tmp_path / "halves").values()) <= {"train", "held"}


def test_split_refuses_data_with_splits_and_bad_ratios(examples, tmp_path, cli):
    ingest([examples / "generic" / "questions_dev.jsonl", examples / "generic" / "documents.jsonl"], tmp_path / "corpus", dataset="generic")
    proc = cli("corpus", "split", tmp_path / "corpus", "--ratios", "0.8,0.1,0.1", "--out", tmp_path / "out", check=2)
    assert "the questions already have splits: dev (2 questions), train (1 questions); --resplit replaces them" in " ".join(proc.stderr.split())
    assert not (tmp_path / "out").exists()
    for ratios, why in (("0.8,0.1", "summing to 1"), ("0.7,x", "expected numbers"), ("1.0", "give 2 or more ratios")):
        proc = cli("corpus", "split", tmp_path / "corpus", "--ratios", ratios, "--resplit", "--out", tmp_path / "out", check=2)
        assert why in proc.stderr
    proc = cli("corpus", "split", tmp_path / "corpus", "--ratios", "0.5,0.5", "--resplit", "--out", tmp_path / "out", "--json")
    assert json.loads(proc.stdout)["replaced"] == {"dev": 2, "train": 1}


def test_split_writes_each_table_part_for_part_and_a_rerun_redoes_only_a_missing_part(examples, tmp_path, cli):
    """The questions and the documents have their own part counts (one part loop, two outputs): the split corpus has
    the input's parts in both, and a documents part lost after the run is all a rerun writes again."""
    from grtool.store.records import load_manifest
    from grtool.store.stage import shard_paths

    cli("-q", "corpus", "ingest", examples / "inline" / "qa.jsonl", "--out", tmp_path / "corpus", "--rows-per-part", "5")
    parts = {t: len(shard_paths(tmp_path / "corpus" / t)) for t in ("questions", "documents")}
    assert parts["documents"] > parts["questions"] > 1, parts  # documents beyond the questions' last part
    out = tmp_path / "split"
    cli("-q", "corpus", "split", tmp_path / "corpus", "--ratios", "0.5,0.5", "--out", out)
    assert {t: len(shard_paths(out / t)) for t in parts} == parts
    assert read_table(out / "documents").to_pylist() == read_table(tmp_path / "corpus" / "documents").to_pylist()
    assert load_manifest(out / "questions").rows == read_table(tmp_path / "corpus" / "questions").num_rows

    last = f"part-{parts['documents'] - 1:05d}"
    kept = {p.name: p.stat().st_mtime_ns for p in (out / "questions").glob("part-*.parquet")}
    (out / "documents" / f"{last}.parquet").unlink()
    (out / "documents" / "_shards" / f"{last}.json").unlink()
    cli("-q", "corpus", "split", tmp_path / "corpus", "--ratios", "0.5,0.5", "--out", out)
    assert read_table(out / "documents").to_pylist() == read_table(tmp_path / "corpus" / "documents").to_pylist()
    assert {p.name: p.stat().st_mtime_ns for p in (out / "questions").glob("part-*.parquet")} == kept  # finished parts kept
    assert load_manifest(out / "documents").complete
