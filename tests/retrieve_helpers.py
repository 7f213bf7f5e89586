"""The retrieval tests' reading of a responses stage: its rows, and a check that every docid in them is in the index."""

from __future__ import annotations

from pathlib import Path

from grtool.store.stage import read_table
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
