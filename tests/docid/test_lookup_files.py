"""The triples lookup as memory-mapped files (grtool.docid.lookup_files): the same answers as a plain Python
reference over the triples, whatever the number of sort buckets; a changed triples stage gets new files,
never the old ones; nothing is written into the triples stage."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from grtool.docid import flip_key, render, triple_key
from grtool.docid.lookup import hash_keys
from grtool.docid.lookup_files import open_lookup
from grtool.vocab.readers import DocidIndex
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter

# (doc_id, head, relation, tail) per shard: a triple in several documents (a collision, across shards), a
# repeated row, a document in several shards, odd spacing, a flip that equals another forward triple, non-ASCII ids
SHARDS = [
    [
        ("d1", "Kiel", "country", "Germany"),
        ("d2", "Kiel", "country", "Germany"),
        ("d1", "Kiel", "twinned with", "Vaasa"),
        ("d1", "Kiel", "twinned with", "Vaasa"),
        ("dé", "Ana,  mon amour", "director", "Călin Peter Netzer"),
    ],
    [("d3", "Kiel", "country", "Germany"), ("d2", "Vaasa", "twinned with", "Kiel"), ("d4", "X  Y", "p ,q", "Z")],
    [("d5", "Al Khor", "country", "Qatar"), ("d6", "Moza bint Nasser", "place of birth", "Al Khor"), ("d1", "Germany", "capital", "Berlin")]
    + [(f"doc{i % 7}", f"head {i}", "relation", f"tail {i % 5}") for i in range(40)],
]


def _write(path: Path, shards: list[list[tuple[str, str, str, str]]]) -> Path:
    stage = StageWriter(path, StageSpec("triples", TRIPLES), num_parts=len(shards))
    for i, rows in enumerate(shards):
        with stage.shard(i) as shard:
            shard.count_in(len(rows))
            shard.write_rows([{"doc_id": d, "idx": j, "head": h, "relation": r, "tail": t, "docid": render((h, r, t))} for j, (d, h, r, t) in enumerate(rows)])
    stage.finish()
    return path


def _reference(shards) -> dict[str, tuple[frozenset[str], bool]]:
    """Key → (documents, flipped) as the lookup's rule says, for every key of the stage and some unknown ones."""
    forward: dict[str, set[str]] = {}
    flipped: dict[str, set[str]] = {}
    for rows in shards:
        for d, h, r, t in rows:
            forward.setdefault(triple_key(h, r, t), set()).add(d)
            flipped.setdefault(flip_key(h, r, t), set()).add(triple_key(h, r, t))
    expected = {k: (frozenset(v), False) for k, v in forward.items()}
    for k, fks in flipped.items():
        if k not in forward:
            assert len(fks) == 1  # the data has no key that is the flip of several triples
            expected[k] = (frozenset(forward[next(iter(fks))]), True)
    for k in ("Kiel,country,France", "nobody,knows,this", ""):
        expected[k] = (frozenset(), False)
    return expected


def test_mapped_lookup_answers_as_the_reference(tmp_path):
    stage = _write(tmp_path / "triples", SHARDS)
    before = sorted(os.listdir(stage))
    expected = _reference(SHARDS)
    keys = sorted(expected)
    answers = []
    for bucket_rows in (4, 1 << 18):  # 16 sort buckets, and one
        lookup = open_lookup(stage, root=tmp_path / f"cache{bucket_rows}", bucket_rows=bucket_rows)
        assert isinstance(lookup.fkeys, np.memmap) and lookup.path.parent == tmp_path / f"cache{bucket_rows}"
        index = DocidIndex(lookup)
        got = dict(zip(keys, index.resolve_many(keys)))
        assert got == expected
        assert index.triples == sum(len(rows) for rows in SHARDS)
        answers.append([np.asarray(getattr(lookup, a)).tolist() for a in ("fkeys", "fdocs", "bkeys", "bfwd", "doc_hashes")])
        assert lookup.doc_ids_of(tuple(range(len(lookup.doc_hashes)))) == {d for rows in SHARDS for d, *_ in rows}
        # the document table is sorted by the ids' hashes, row for row
        ids = [next(iter(lookup.doc_ids_of((i,)))) for i in range(len(lookup.doc_hashes))]
        assert hash_keys(ids).tolist() == np.asarray(lookup.doc_hashes).tolist()
    assert answers[0] == answers[1]
    assert sorted(os.listdir(stage)) == before  # the input stage is never written


def test_a_changed_stage_is_not_answered_from_the_old_files(tmp_path, monkeypatch):
    monkeypatch.setenv("GRTOOL_CACHE", str(tmp_path / "cache"))
    stage = _write(tmp_path / "triples", SHARDS[:1])
    first = DocidIndex.build(stage)
    assert first.resolve("Kiel,country,Germany") == (frozenset({"d1", "d2"}), False)
    assert DocidIndex.build(stage).lookup.path == first.lookup.path  # reused, not rebuilt
    shutil.rmtree(stage)
    _write(stage, [[("d9", "Kiel", "country", "Germany"), ("d9", "Lund", "country", "Sweden")]])  # same path, new rows
    second = DocidIndex.build(stage)
    assert second.lookup.path != first.lookup.path
    assert second.resolve("Kiel,country,Germany") == (frozenset({"d9"}), False)
    assert second.resolve("Sweden,country,Lund") == (frozenset({"d9"}), True)
    assert second.resolve("Kiel,twinned with,Vaasa") == (frozenset(), False)
    assert sorted(p.name for p in (tmp_path / "cache" / "lookups").iterdir()) == sorted([first.lookup.path.name, second.lookup.path.name])


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GRTOOL_CACHE", str(blocker))  # cache/lookups cannot be made below a file
    stage = _write(tmp_path / "triples", SHARDS)
    index = DocidIndex.build(stage)
    assert index.resolve("Kiel,country,Germany") == (frozenset({"d1", "d2", "d3"}), False)
    assert not index.lookup.path.exists()  # built in a temporary directory, removed once mapped


def test_index_doc_ids_are_read_line_by_line_from_the_mapped_file(tmp_path):
    from grtool.errors import InputError
    from grtool.index.base import DocIds

    path = tmp_path / "doc_ids.txt"
    path.write_bytes("a\nKöln\n\nlast\n".encode())
    ids = DocIds(path)
    assert len(ids) == 4 and list(ids) == ["a", "Köln", "", "last"] and ids[-1] == "last" and ids[1:3] == ["Köln", ""]
    path.write_bytes(b"a\n\xff\n")
    try:
        DocIds(path)[1]
    except InputError as e:
        assert "doc_ids.txt" in str(e) and "line 2" in str(e)
    else:
        raise AssertionError("a line that is not UTF-8 must be an error naming the file")


def test_the_cache_keeps_the_most_recently_used_lookups_under_its_limit(tmp_path, monkeypatch):
    """Over $GRTOOL_LOOKUP_CACHE_GB, writing a lookup removes the least recently used others (a lookup a run
    reuses counts as used); the one just written stays even alone over the limit; a lookup a run already mapped
    keeps answering after its files are removed; temporaries of killed runs go; a bad limit is refused first."""
    import time

    import pytest

    from grtool.docid.lookup_files import RECORD, cache_dir
    from grtool.errors import InputError

    monkeypatch.setenv("GRTOOL_CACHE", str(tmp_path / "cache"))
    stages = [_write(tmp_path / f"t{i}", [[(f"d{i}", f"Head {i}", "country", "Germany")] * (1 + i)]) for i in range(3)]
    a = DocidIndex.build(stages[0])
    b = DocidIndex.build(stages[1])
    size = sum(f.stat().st_size for f in a.lookup.path.iterdir())
    old = time.time() - 100
    os.utime(b.lookup.path / RECORD, (old, old))  # b written after a ...
    DocidIndex.build(stages[0])  # ... but a used since: b is the least recently used
    leftover = cache_dir() / ".killed-run"
    leftover.mkdir()
    os.utime(leftover, (old - 86_400, old - 86_400))
    monkeypatch.setenv("GRTOOL_LOOKUP_CACHE_GB", str(2.5 * size / 2**30))  # room for two lookups of this size
    c = DocidIndex.build(stages[2])
    assert sorted(p.name for p in cache_dir().iterdir()) == sorted([a.lookup.path.name, c.lookup.path.name])
    assert b.resolve("Head 1,country,Germany") == (frozenset({"d1"}), False)  # its mapping outlives the files
    monkeypatch.setenv("GRTOOL_LOOKUP_CACHE_GB", "0")
    DocidIndex.build(stages[1])  # written again, the others removed: the limit holds nothing else
    assert [p.name for p in cache_dir().iterdir()] == [b.lookup.path.name]
    shutil.rmtree(cache_dir())
    monkeypatch.setenv("GRTOOL_LOOKUP_CACHE_GB", "lots")
    with pytest.raises(InputError, match="GRTOOL_LOOKUP_CACHE_GB"):
        DocidIndex.build(stages[0])
    assert not cache_dir().exists()


def test_handing_memory_back_starts_no_process(monkeypatch):
    """release_build_memory runs between every few chunks of a build: it finds malloc_trim once, in the process,
    and never forks (ctypes.util.find_library ran ldconfig in a child, a fork of a build holding hundreds of MB,
    that doubled the process tree's resident memory while it lived)."""
    import subprocess

    import grtool.docid.lookup as lookup

    started: list[object] = []

    class NoChild(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            started.append(args)
            raise AssertionError("a child process was started")

    monkeypatch.setattr(subprocess, "Popen", NoChild)
    lookup._malloc_trim.cache_clear()
    lookup.release_build_memory()
    lookup.release_build_memory()
    assert started == []
    assert lookup._malloc_trim() is not None  # glibc (the test machines): the trim is found
