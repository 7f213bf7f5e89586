"""Bracket decoding asks the docid texts on disk (grtool.index.docid_bytes), not a Python set of every docid.

The files written from docids.parquet must give exactly the answers of the in-memory sorted list: the same
order, the same bisects, and the same allowed tokens at every prefix.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import TEST_DATA
from grtool.index import docid_bytes
from grtool.index.docid_bytes import DocidBytes, open_docid_bytes, write_docid_bytes
from grtool.index.text_constraint import BracketConstraint, token_bytes

BASE = [line for line in (TEST_DATA / "bracket_docids.txt").read_text(encoding="utf-8").splitlines() if line]


def _sample() -> list[str]:
    """The bundled docids and harder neighbours: long shared prefixes (ties past 8 bytes), texts that are
    prefixes of others, brackets inside (left out), non-ASCII, a NUL byte, an empty text."""
    rng = random.Random(5)
    extra = [
        "The United States of America, capital, Washington",
        "The United States of America, capital, Washington, D.C.",
        "The United States of America, currency, dollar",
        "The United States",
        "The United",
        "The Unite",
        "The Unit",
        "The Uni",
        "Zürich, located in, Switzerland",
        "Zürich, located in, Schweiz",
        "東京, country, 日本",
        "a\x00b, r, t",
        "a, r, t",
        "a\x00, r, t",
        "[bracketed], r, t",
        "x, r, [y]",
        "a]b, r, t",
        "",
    ]
    trip = [d.split(", ", 2) for d in BASE]
    heads, rels, tails = (sorted({t[k] for t in trip}) for k in range(3))
    more = {f"{rng.choice(heads)}, {rng.choice(rels)}, {rng.choice(tails)}" for _ in range(600)}
    return BASE + extra + sorted(more)


def _write_index(path: Path, texts: list[str], row_group: int = 97) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    table = pa.table({"docid": [f"<docid_start>{t}<docid_end>" for t in dict.fromkeys(texts)]})
    pq.write_table(table, path / "docids.parquet", row_group_size=row_group)
    return path


def test_files_sort_and_bisect_like_the_list(tmp_path, monkeypatch):
    texts = _sample()
    monkeypatch.setattr(docid_bytes, "_CHUNK", 64)  # several vectorized chunks even on a small sample
    monkeypatch.setattr(docid_bytes, "_WRITE_CHUNK", 16)
    index = _write_index(tmp_path / "index", texts)
    write_docid_bytes(index)
    on_disk = open_docid_bytes(index)
    want = sorted({t.encode() for t in texts if t and "[" not in t and "]" not in t})
    assert list(on_disk) == want
    assert list(DocidBytes.from_texts(texts)) == want
    rng = random.Random(2)
    queries = [d[:k] for d in want for k in (0, 1, 7, 8, 9, 15, 16, 17, len(d))] + [d + b"\xff" for d in want[:50]]
    queries += [bytes(rng.randrange(256) for _ in range(rng.randrange(12))) for _ in range(300)]
    for q in queries:
        assert on_disk.bisect_left(q) == bisect_left(want, q), q
        lo = rng.randrange(len(want))
        hi = rng.randrange(lo, len(want) + 1)
        assert on_disk.bisect_left(q, lo, hi) == bisect_left(want, q, lo, hi), (q, lo, hi)
        assert (q in on_disk) == (q in set(want))


@pytest.mark.parametrize("name", ["default", "llama3"])
def test_allowed_tokens_match_the_set_based_constraint(tmp_path, name):
    from grtool.index.tokenizer import load_tokenizer

    texts = _sample()
    vocab = token_bytes(load_tokenizer(name).tokenizer)
    index = _write_index(tmp_path / "index", texts)
    on_disk = BracketConstraint(open_docid_bytes(index), vocab)
    in_memory = BracketConstraint(texts, vocab)  # the set-based constraint of before
    assert isinstance(on_disk.docs, DocidBytes) and list(on_disk.docs) == in_memory.docs
    assert np.array_equal(on_disk.allowed(None).ids, in_memory.allowed(None).ids)
    rng = random.Random(11)
    prefixes = {b""} | {d[:k] for d in in_memory.docs for k in range(len(d) + 1) if rng.random() < 0.08}
    prefixes |= {b"Qzx", "Zür".encode()[:2], b"The Unit", b"a\x00"}
    for p in sorted(prefixes):
        assert np.array_equal(on_disk.allowed(p), in_memory.allowed(p)), p


def test_written_on_first_use_and_again_when_the_docids_change(tmp_path):
    from grtool.index.tokenizer import load_tokenizer

    index = _write_index(tmp_path / "index", BASE[:40])
    assert not (index / docid_bytes.RECORD).exists()
    tok = load_tokenizer("default")
    c = BracketConstraint.from_index(index, tok)
    assert isinstance(c.docs, DocidBytes) and len(c.docs) == 40
    assert sorted(p.name for p in index.iterdir() if not p.name.startswith(".")) == sorted(["docids.parquet", *docid_bytes.FILES])
    # A rebuilt docids.parquet (another index in the same place): the files are stale and written again.
    _write_index(index, BASE[40:50])
    again = open_docid_bytes(index)
    assert list(again) == sorted(d.encode() for d in BASE[40:50])
    assert not [p for p in index.iterdir() if p.name.endswith((".tmp", ".scratch"))]  # no temporaries left


def test_no_docids_parquet_is_one_line_error(tmp_path):
    from grtool.errors import InputError

    with pytest.raises(InputError, match="no docids.parquet"):
        open_docid_bytes(tmp_path)


def test_a_damaged_file_is_found_by_its_digest_and_written_again(tmp_path, caplog):
    """docid_bytes.json records each file's size and BLAKE3: a byte changed in place (same size) is not used;
    opening writes the files again (they are derived from docids.parquet) with a warning, and loading the damaged
    files directly is an error naming them."""
    from grtool.errors import InputError

    index = _write_index(tmp_path / "index", BASE[:40])
    want = list(open_docid_bytes(index))
    text = bytearray((index / docid_bytes.TEXT).read_bytes())
    text[len(text) // 2] ^= 0x01
    (index / docid_bytes.TEXT).write_bytes(bytes(text))
    with pytest.raises(InputError, match="docid_bytes files.*damaged"):
        docid_bytes.load_docid_bytes(index)
    assert list(open_docid_bytes(index)) == want
    assert "stale or damaged" in caplog.text
