"""The retrieval tests' run (the samples corpus and an FM-index of its triples), the rows of a responses stage, and a
check that every docid in them is in the index."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from grtool.store.stage import read_table
from sample_helpers import build_samples
from grtool.vocab.readers import DocidIndex


def table_rows(path: Path) -> list[dict]:
    return read_table(path).to_pylist()


def assert_all_exist(rows: list[dict], lookup: DocidIndex) -> int:
    from grtool.docid import parse

    n = 0
    for row in rows:
        keys = parse(row["text"]).docids
        assert len(keys) == row["n_docids"]
        for key, (docs, _) in zip(keys, lookup.resolve_many(keys)):
            assert docs, f"{row['qid']}: hallucinated docid {key!r} in {row['text']!r}"
            n += 1
    return n


def build_indexed_samples(root: Path) -> Path:
    """A corpus with triples and an FM-index (forward and flipped docids) with the embedded model's tokenizer."""
    build_samples(root)
    run_cli("index", "build", root / "triples", "--tokenizer", "default", "--flips", "--out", root / "index")
    return root
