"""`index build` streams the docids (columns, a token file on disk, pieces tokenized once): the index it writes
is the one the in-memory reference path writes, file for file; indexes of the reference path open as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from index_helpers import BUNDLED, two_wiki_rows, write_triples_stage

from grtool.docid import DOCID_END, DOCID_START
from grtool.errors import InputError
from grtool.index.base import META, Index
from grtool.index.build import build_index, read_docids, tokenize, write_whole_index
from grtool.index.stream import pieces_agree, read_sequences
from grtool.index.tokenizer import load_tokenizer
from grtool.store.fingerprints import fingerprint
from grtool.store.records import resolve_stage

VOLATILE = ("created", "build_seconds", "build", "command")  # "build": timings, scratch disk


def _row(doc_id: str, h: str, r: str, t: str, docid: str | None = None, idx: int = 0) -> dict:
    return {"doc_id": doc_id, "idx": idx, "head": h, "relation": r, "tail": t, "docid": docid or f"{DOCID_START}{h}, {r}, {t}{DOCID_END}"}


def _odd_rows() -> list[dict]:
    """What the columnar path must settle exactly as the Python rules do: repeats across documents, spellings of
    one key, a symmetric pair, a hand-made docid that is not its parts' rendering, parts the syntax rejects, heads
    and relations ending in punctuation (tokenized whole), non-ASCII text."""
    return [
        _row("d1", "Paris, Texas", "country", "United States"),
        _row("d2", "Paris, Texas", "country", "United States"),
        _row("d3", "Paris, Texas", "country", "United States", docid=f"{DOCID_START}Paris, Texas ,  country, United States{DOCID_END}"),
        _row("d1", "Ana", "sibling", "Bob"),
        _row("d4", "Bob", "sibling", "Ana"),
        _row("d4", "x", "y", "z", docid=f"{DOCID_START}just a title, of sorts, here{DOCID_END}"),
        _row("d5", "U.S.", "capital", "Washington, D.C."),
        _row("d5", "Jr.", "born in (year)", "1960"),
        _row("d6", "Theodor Dräger", "place of birth", "Lübeck"),
        _row("d7", "bad [x]", "rel", "tail"),
        _row("d7", "Kiel", "rel", "tail, "),
        _row("d8", "Kiel", "mayor", "Ulf Kämpfer"),
    ]


def _reference(stage: Path, out: Path, tokenizer: str, flips: bool) -> None:
    """The in-memory path grtool used before streaming: read_docids + tokenize + write_whole_index."""
    tok = load_tokenizer(tokenizer)
    read = read_docids(stage, flips=flips)
    flat, lengths = tokenize(tok, read.docids)
    counts = {"docids_skipped": read.skipped.count} | ({"flips_unsplit": read.unsplit, "flips_symmetric": read.symmetric} if flips else {})
    write_whole_index(out, kind="fm", flat=flat, lengths=lengths, seq_docs=read.seq_docs, doc_ids=read.doc_ids, tokenizer=tok, source="docids",
                docids=read.docids, inputs=[fingerprint(resolve_stage(stage, "triples"))], params={}, seq_flipped=read.flipped if flips else None,
                flip_counts=counts)  # fmt: skip


def _same_index(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name != META:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ma, mb = (json.loads((p / META).read_text()) for p in (a, b))
    for m in (ma, mb):
        for key in VOLATILE:
            m.pop(key, None)
    assert ma == mb


@pytest.mark.parametrize(("tokenizer", "flips", "data"), [("llama3", True, "odd"), ("qwen", False, "odd"), ("llama3", True, "2wiki"), ("qwen", True, "bundled")])
def test_streamed_build_equals_the_reference_path(tmp_path, tokenizer, flips, data):
    rows = {"odd": _odd_rows, "2wiki": lambda: two_wiki_rows(), "bundled": lambda: [json.loads(x) for x in BUNDLED.read_text().splitlines()]}[data]()
    stage = write_triples_stage(tmp_path / "triples", rows)
    _reference(stage, tmp_path / "old", tokenizer, flips)
    build_index(stage, tmp_path / "new", tokenizer=tokenizer, flips=flips)
    _same_index(tmp_path / "old", tmp_path / "new")
    # an index the reference path wrote is read as before, and is kept by an identical build
    assert Index.open(tmp_path / "old").num_sequences == Index.open(tmp_path / "new").num_sequences
    assert build_index(stage, tmp_path / "old", tokenizer=tokenizer, flips=flips).get("up_to_date") is True


def test_pieces_are_joined_only_where_the_tokenizer_agrees(tmp_path):
    """llama3 splits at the piece boundaries (pieces joined); a tokenizer that puts a word-start marker before
    every text it is given (Metaspace, as SentencePiece models do) does not: every docid is tokenized whole, and
    the index is still the reference one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rows = _odd_rows() * 3
    stage = write_triples_stage(tmp_path / "triples", rows)
    seqs = read_sequences(stage, flips=True)
    assert pieces_agree(load_tokenizer("llama3"), seqs.frame)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tok.train_from_iterator([r["docid"] for r in rows], trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", DOCID_START, DOCID_END]))
    tok.save(str(tmp_path / "tokenizer.json"))
    spec = str(tmp_path / "tokenizer.json")
    assert not pieces_agree(load_tokenizer(spec), seqs.frame)
    _reference(stage, tmp_path / "old", spec, True)
    build_index(stage, tmp_path / "new", tokenizer=spec, flips=True)
    _same_index(tmp_path / "old", tmp_path / "new")


def test_agreement_sample_is_spread_over_the_whole_corpus_in_one_pass(tmp_path, monkeypatch):
    """The merge draws the agreement sample as it writes the sequences (no second read of them): every k-th parted
    sequence, k the smallest power of two that keeps it under twice the sample size, from the first sorted docid to
    the last, not just the first chunks."""
    import polars as pl

    import grtool.index.stream as stream
    from grtool.index.stream import _SpreadSample

    spread = _SpreadSample(8)
    for lo in range(0, 100, 7):  # frames of uneven size, as the merge emits them
        spread.add(pl.DataFrame({"n": list(range(lo, min(100, lo + 7)))}))
    assert [r[0] for r in spread.rows] == list(range(0, 100, 8))  # step doubled 1 -> 8 as rows came, never lost evenness
    assert spread.frame({"n": pl.Int64}).get_column("n").to_list() == list(range(0, 100, 16))

    monkeypatch.setattr(stream, "AGREEMENT_SAMPLE", 4)
    rows = [_row(f"d{i}", f"Head {i:03d}", "relation", f"Tail {i}") for i in range(60)]
    seqs = read_sequences(write_triples_stage(tmp_path / "triples", rows))
    got = seqs.sample.get_column("docid").to_list()
    every = seqs.frame.filter(pl.col("lh").is_not_null()).get_column("docid").to_list()
    assert 4 <= len(got) <= 8 and got == sorted(got) and set(got) <= set(every)
    assert got[0] == every[0] and got[-1] >= every[len(every) // 2]


def _punches_holes(where: Path) -> bool:
    """Whether the file system under ``where`` frees the blocks of a punched range (ext4, xfs, tmpfs do)."""
    import ctypes
    import os

    probe = where / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT)
    try:
        os.pwrite(fd, b"x" * (1 << 20), 0)
        os.fsync(fd)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        ok = libc.fallocate(fd, 3, 0, 1 << 20) == 0  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        return ok and os.fstat(fd).st_blocks * 512 < (1 << 19)
    finally:
        os.close(fd)
        probe.unlink()


def test_fm_build_scratch_disk_is_about_four_bytes_a_symbol(tmp_path):
    """The FM build's scratch disk: the token file it reads is given back as it is read, the suffix sorter's
    file holds positions (4 bytes) and gives back what it has sorted. Its peak (as the file system counts
    blocks) stays near 4 bytes a symbol, where 16-byte items appended and never freed took ~30; the index is
    the one an in-memory array gives."""
    import numpy as np

    from grtool.index.kinds import build_fm_arrays

    if not _punches_holes(tmp_path):
        pytest.skip("this file system does not free punched ranges")
    rng = np.random.default_rng(3)
    lengths = rng.integers(3, 30, 40_000)
    flat = ((rng.zipf(1.3, int(lengths.sum())) * 7) % 20_000).astype(np.uint32)
    path = tmp_path / ".scratch-tokens.u32"
    flat.tofile(path)
    mapped = np.memmap(path, dtype=np.uint32, mode="r")
    built = build_fm_arrays(mapped, lengths, sample_rate=8, scratch_dir=tmp_path, sort_items=30_000, consume=True)
    n = int(flat.size + len(lengths)) + 1
    assert built["scratch_bytes"] <= 4 * n + (256 << 10), (built["scratch_bytes"], n)
    assert path.stat().st_blocks * 512 <= 8192  # the token file's disk went back (its size is kept)
    assert path.stat().st_size == flat.nbytes
    reference = build_fm_arrays(flat, lengths, sample_rate=8, sort_items=30_000)
    for name, arr in reference["arrays"].items():
        assert np.array_equal(arr, built["arrays"][name]), name


def test_index_records_where_its_build_time_and_disk_went(tmp_path):
    """index.json keeps build_seconds and adds the reading, tokenizing and FM-build seconds and the peak of
    scratch disk (`index stats` shows them)."""
    stage = write_triples_stage(tmp_path / "triples", _odd_rows())
    build_index(stage, tmp_path / "idx", tokenizer="llama3")
    meta = json.loads((tmp_path / "idx" / META).read_text())
    assert set(meta["build"]) == {"read_seconds", "tokenize_seconds", "core_seconds", "scratch_bytes"}
    assert meta["build"]["scratch_bytes"] > 0 and meta["build_seconds"] >= meta["build"]["core_seconds"] > 0


def test_the_tokenizer_is_not_held_while_the_stage_is_read(tmp_path, monkeypatch):
    """A 128K-vocabulary tokenizer is ~150 MB while it loads: --tokenizer is checked without loading it and the
    tokenizer is loaded after the stage is read, so the read's peak does not carry it."""
    import gc

    import grtool.index.stream as stream
    from grtool.index.tokenizer import DocidTokenizer

    def alive() -> int:
        gc.collect()
        return sum(isinstance(o, DocidTokenizer) for o in gc.get_objects())

    during: list[int] = []
    read = stream.read_sequences

    def observed(*args, **kwargs):
        during.append(alive())
        return read(*args, **kwargs)

    monkeypatch.setattr(stream, "read_sequences", observed)
    stage = write_triples_stage(tmp_path / "triples", _odd_rows())
    before = alive()
    build_index(stage, tmp_path / "idx", tokenizer="llama3")
    assert during == [before]
    assert Index.open(tmp_path / "idx").num_sequences > 0


def test_the_tokenizer_is_loaded_once(tmp_path, monkeypatch):
    """One load per build (each load of a 128K vocabulary parses ~9 MB of JSON into ~150 MB); the index records
    the tokenizer that load made."""
    import grtool.index.build as build

    loads: list[str] = []

    def counted(spec):
        loads.append(str(spec))
        return load_tokenizer(spec)

    monkeypatch.setattr(build, "load_tokenizer", counted)
    stage = write_triples_stage(tmp_path / "triples", _odd_rows())
    build_index(stage, tmp_path / "idx", tokenizer="llama3")
    assert loads == ["llama3"]
    meta = json.loads((tmp_path / "idx" / META).read_text())
    assert meta["tokenizer"]["sha256"] == load_tokenizer("llama3").fingerprint()


def test_a_tokenizer_that_cannot_be_found_stops_the_build_before_the_read(tmp_path, monkeypatch):
    """--tokenizer is checked before the stage is read (a typo costs no read), and nothing is left at --out."""
    import grtool.index.stream as stream

    reads: list[int] = []
    read = stream.read_sequences
    monkeypatch.setattr(stream, "read_sequences", lambda *a, **k: reads.append(1) or read(*a, **k))
    stage = write_triples_stage(tmp_path / "triples", _odd_rows())
    with pytest.raises(InputError, match="no-such-tokenizer.json"):
        build_index(stage, tmp_path / "idx", tokenizer=str(tmp_path / "no-such-tokenizer.json"))
    assert reads == [] and not (tmp_path / "idx").exists()


@pytest.mark.parametrize(("flips", "data"), [(True, "odd"), (True, "2wiki"), (False, "2wiki")])
def test_bucketed_read_equals_the_reference_path(tmp_path, monkeypatch, flips, data):
    """The read settles the stage bucket by bucket (rows split by a hash of the docid's key) and merges sorted runs
    a few rows at a time: with tiny buckets, merge steps and docids.parquet row groups the index is still the
    reference one, byte for byte (the reference writes the same row groups), and docids.parquet has those groups."""
    import pyarrow.parquet as pq

    import grtool.index.build as build
    import grtool.index.stream as stream

    monkeypatch.setattr(stream, "ROWS_PER_BUCKET", 4)
    monkeypatch.setattr(stream, "MERGE_ROWS", 7)
    monkeypatch.setattr(stream, "RUN_BATCH", 1)  # runs of several batches, read one at a time,
    monkeypatch.setattr(stream, "MERGE_BATCHES", 1)  # and emitted in many small steps
    monkeypatch.setattr(stream, "ROW_GROUP", 5)
    monkeypatch.setattr(build, "DOCIDS_ROW_GROUP", 5)
    rows = _odd_rows() * 2 if data == "odd" else two_wiki_rows()
    stage = write_triples_stage(tmp_path / "triples", rows)
    _reference(stage, tmp_path / "old", "llama3", flips)
    build_index(stage, tmp_path / "new", tokenizer="llama3", flips=flips)
    _same_index(tmp_path / "old", tmp_path / "new")
    meta = pq.ParquetFile(tmp_path / "new" / "docids.parquet").metadata
    assert meta.num_row_groups > 2 and all(meta.row_group(i).num_rows == 5 for i in range(meta.num_row_groups - 1))
    assert not list(tmp_path.glob(".new.*"))  # no scratch left
