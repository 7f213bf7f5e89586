"""`grtool index build --flips`: every docid's tail-first spelling is a sequence of its own, mapping to the same
documents, flagged as flipped; symmetric triples share one sequence; old indexes still open."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from index_helpers import BUNDLED, write_triples_stage

from grtool.docid import DOCID_END, DOCID_START
from grtool.index.base import Index
from grtool.index.build import build_index, stats
from grtool.index.query import prefix_ids, query


def _rows() -> list[dict]:
    return [json.loads(line) for line in BUNDLED.read_text().splitlines()]


def _row(doc_id: str, idx: int, h: str, r: str, t: str, docid: str | None = None) -> dict:
    return {"doc_id": doc_id, "idx": idx, "head": h, "relation": r, "tail": t, "docid": docid or f"{DOCID_START}{h}, {r}, {t}{DOCID_END}"}


def _flip_text(docid: str) -> str:
    h, r, t = docid[len(DOCID_START) : -len(DOCID_END)].split(", ", 2)
    return f"{t}, {r}, {h}"


@pytest.mark.parametrize("kind", ["fm", "trie"])
def test_flipped_docids_are_indexed_and_find_their_documents(cli, tmp_path, kind):
    rows = _rows()
    docs: dict[str, set[str]] = {}
    for r in rows:
        docs.setdefault(r["docid"], set()).add(r["doc_id"])
    out = tmp_path / "idx"
    built = json.loads(cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, "--kind", kind, "--flips", "--json", input=BUNDLED.read_text()).stdout)
    assert built["params"]["flips"] is True
    assert built["sequences"] == 2 * len(docs) and built["flipped_sequences"] == len(docs)
    assert built["flips_unsplit"] == 0 and built["flips_symmetric"] == 0
    assert 0.4 < built["flips_token_share"] < 0.6 and built["flipped_tokens"] == round(built["flips_token_share"] * built["tokens"])
    table = pq.read_table(out / "docids.parquet").to_pylist()
    assert sorted(r["docid"] for r in table if not r["flipped"]) == sorted(docs)
    assert sorted(r["docid"] for r in table if r["flipped"]) == sorted(f"{DOCID_START}{_flip_text(d)}{DOCID_END}" for d in docs)
    index = Index.open(out)
    assert [index.is_flipped(i) for i in range(len(table))] == [r["flipped"] for r in table]
    for docid, want in docs.items():
        flipped = _flip_text(docid)
        got = json.loads(cli("index", "query", out, flipped + DOCID_END, "--json").stdout) if docid == min(docs) else query(index, prefix_ids(index, flipped + DOCID_END))
        assert got["docs"] == sorted(want) and got["flipped"] is True and got["count"] == 1, docid
        forward = query(index, prefix_ids(index, docid))
        assert forward["docs"] == sorted(want) and forward["flipped"] is False
        # a prefix of the flipped docid is a valid decoding path
        part = query(index, prefix_ids(index, flipped.split(",")[0] + ","))
        assert part["count"] >= 1 and part["next"] and part["flipped"] is None
        ids = index.tokenizer.encode(DOCID_START + flipped + DOCID_END)
        assert index.resolve_docid(ids) == (sorted(want), True) and index.docid_flipped(ids[1:-1]) is True
        assert index.docid_flipped(index.tokenizer.encode(docid)) is False
    assert index.docid_flipped(index.tokenizer.encode(f"{DOCID_START}no such, docid, here{DOCID_END}")) is None
    # the summary line names the cost
    line = cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, "--flips", "--overwrite", input=BUNDLED.read_text(), env={"COLUMNS": "300"}).stderr
    assert f"{len(docs)} of them flipped ({built['flips_token_share']:.1%} of the tokens)" in line
    from grtool.audit.validate import validate_index

    assert not validate_index(out).problems


def test_without_flips_a_flipped_docid_is_not_found_and_old_indexes_open(cli, tmp_path):
    out = tmp_path / "idx"
    cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, input=BUNDLED.read_text())
    index = Index.open(out)
    docid = _rows()[0]["docid"]
    assert query(index, prefix_ids(index, _flip_text(docid) + DOCID_END))["docs"] == []
    assert not (out / "seq_flipped.npy").exists() and pq.read_table(out / "docids.parquet").column_names == ["docid"]
    assert index.is_flipped(0) is False and index.docid_flipped(index.tokenizer.encode(docid)) is False and not index.flips
    # an index.json written before --flips existed (no params.flips, no flip sizes)
    meta = json.loads((out / "index.json").read_text())
    del meta["params"]["flips"]
    (out / "index.json").write_text(json.dumps(meta))
    old = Index.open(out)
    report = stats(old)
    assert not old.flips and report["flipped_sequences"] == 0 and report["flips_token_share"] == 0.0
    assert query(old, prefix_ids(old, docid))["flipped"] is False


def test_symmetric_triples_share_one_sequence_and_unsplit_docids_stay_forward(tmp_path):
    rows = [
        _row("d1", 0, "Anna", "sibling", "Ben"),
        _row("d2", 0, "Ben", "sibling", "Anna"),  # the flip of d1's triple: one sequence each way, both documents
        _row("d3", 0, "Launch", "date", "July 31, 2012"),  # the tail holds a comma
        _row("d4", 0, "x", "y", "z", docid=f"{DOCID_START}just a title{DOCID_END}"),  # not its parts' rendering
    ]
    stage = write_triples_stage(tmp_path / "triples", rows)
    meta = build_index(stage, tmp_path / "idx", tokenizer="qwen", flips=True)
    sizes = meta["sizes"]
    assert sizes["sequences"] == 5 and sizes["flipped_sequences"] == 1
    assert sizes["flips_symmetric"] == 2 and sizes["flips_unsplit"] == 1
    index = Index.open(tmp_path / "idx")
    enc = index.tokenizer.encode
    assert index.resolve_docid(enc(rows[0]["docid"])) == (["d1", "d2"], False)
    assert index.resolve_docid(enc(rows[1]["docid"])) == (["d1", "d2"], False)
    assert index.resolve_docid(enc(f"{DOCID_START}July 31, 2012, date, Launch{DOCID_END}")) == (["d3"], True)
    assert index.resolve_docid(enc(rows[3]["docid"])) == (["d4"], False)


def test_flips_need_docids(cli, tmp_path):
    err = cli("index", "build", tmp_path, "--tokenizer", "qwen", "--source", "documents", "--flips", "--out", tmp_path / "i", check=2, env={"COLUMNS": "300"}).stderr
    assert "--flips" in err and "--source docids" in err
    assert not Path(tmp_path / "i").exists()
