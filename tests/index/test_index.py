"""grtool index: the native FM-index, the prefix tree and the numpy oracle agree; build/query/stats CLI."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from grtool.index.base import Index
from grtool.index.kinds import FMIndex, NumpyIndex, TrieIndex
from grtool.index.query import query
from grtool.store.stage import StageSpec, StageWriter
from grtool.store.records import sha256_file
from index_helpers import BUNDLED, two_wiki_rows, write_triples_stage

# ------------------------------------------------------------------------------------------ helpers


def flatten(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    flat = np.array([t for s in seqs for t in s], dtype=np.int64)
    return flat, np.array([len(s) for s in seqs], dtype=np.int64)


def walk(index, ids, anchored=True):
    state = index.start() if isinstance(index, TrieIndex) else index.start(anchored)
    for t in ids:
        state = index.extend(state, t)
    return state


def answers(index, ids, anchored=True, limit=10**9):
    state = walk(index, ids, anchored)
    got_ids, counts = index.next_tokens(state)
    located = index.locate(state, limit) if (ids or anchored) else None
    return got_ids.tolist(), counts.tolist(), index.count(state), None if located is None else located.tolist()


def brute_force(docid_ids: dict[str, list[int]], docs_by_docid: dict[str, set[str]], prefix: list[int]) -> dict:
    nxt: dict[int, int] = defaultdict(int)
    count = 0
    docs: set[str] = set()
    for docid, ids in docid_ids.items():
        if ids[: len(prefix)] == prefix:
            count += 1
            if len(ids) > len(prefix):
                nxt[ids[len(prefix)]] += 1
            else:
                docs |= docs_by_docid[docid]
    return {"next": sorted(nxt.items()), "count": count, "docs": sorted(docs)}


# --------------------------------------------------------------------------------- property tests

sequences = st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=7), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seqs=sequences, probes=st.lists(st.lists(st.integers(0, 9), max_size=5), max_size=8), rate=st.sampled_from([1, 2, 3, 32]), data=st.data())
def test_fm_trie_and_oracle_agree(tmp_path_factory, seqs, probes, rate, data):
    flat, lengths = flatten(seqs)
    fm = FMIndex.from_sequences(flat, lengths, sample_rate=rate)
    oracle = NumpyIndex.from_sequences(flat, lengths)
    trie = TrieIndex.from_sequences(flat, lengths, tmp_path_factory.mktemp("trie"))
    # prefixes of real sequences (mostly hits) plus random ones (mostly misses)
    real = [s[: data.draw(st.integers(0, len(s)))] for s in data.draw(st.lists(st.sampled_from(seqs), max_size=8))]
    for prefix in [[], *real, *probes]:
        expected = answers(oracle, prefix)
        assert answers(fm, prefix) == expected, prefix
        assert answers(trie, prefix) == expected, prefix
        # substring search (not anchored at a sequence start): FM against the oracle
        assert answers(fm, prefix, anchored=False) == answers(oracle, prefix, anchored=False), prefix
        if expected[2] > 1:  # a limit below the count returns that many of the occurrences
            part = fm.locate(walk(fm, prefix), expected[2] - 1).tolist()
            assert len(part) == expected[2] - 1 and all(p in expected[3] for p in part)


@settings(max_examples=120, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 5), max_size=9), min_size=1, max_size=60).flatmap(
        lambda base: st.lists(st.sampled_from(base), min_size=1, max_size=120)  # repeated sequences, empty ones
    ),
    items=st.integers(1, 40),
)
def test_bucketed_suffix_sorting_gives_the_same_index(seqs, items):
    """However small the sorting buckets (splits by the next symbol, by ranges of ties when many local strings
    are equal, several levels deep), the index arrays are the ones a single bucket gives."""
    from grtool.index.kinds import build_fm_arrays

    flat, lengths = flatten(seqs)
    whole = build_fm_arrays(flat, lengths, sample_rate=3)
    small = build_fm_arrays(flat, lengths, sample_rate=3, sort_items=items)
    assert whole["dollar_row"] == small["dollar_row"]
    for name, arr in whole["arrays"].items():
        assert np.array_equal(arr, small["arrays"][name]), name


def test_bucketed_index_answers_like_the_oracle():
    """Tiny buckets on a skewed corpus with many repeated docids, checked against the numpy oracle."""
    rng = np.random.default_rng(5)
    pool = [((rng.zipf(1.3, size=rng.integers(1, 9)) * 3) % 400).tolist() for _ in range(300)]
    seqs = [pool[i] for i in rng.integers(0, len(pool), 2000)]
    flat, lengths = flatten(seqs)
    fm, oracle = FMIndex.from_sequences(flat, lengths, sample_rate=4, sort_items=50), NumpyIndex.from_sequences(flat, lengths)
    for s in pool[:100]:
        for cut in (0, 1, len(s) // 2, len(s)):
            assert answers(fm, s[:cut]) == answers(oracle, s[:cut])
        assert answers(fm, s[1:3], anchored=False) == answers(oracle, s[1:3], anchored=False)


def test_sparse_large_token_ids_and_long_sequences():
    rng = np.random.default_rng(7)
    vocab = rng.choice(2_000_000, size=300, replace=False)
    seqs = [rng.choice(vocab, size=rng.integers(1, 60)).tolist() for _ in range(400)]
    flat, lengths = flatten(seqs)
    fm, oracle = FMIndex.from_sequences(flat, lengths, sample_rate=8), NumpyIndex.from_sequences(flat, lengths)
    for s in seqs[:80]:
        for cut in (0, 1, len(s) // 2, len(s)):
            assert answers(fm, s[:cut]) == answers(oracle, s[:cut])
            assert answers(fm, s[cut : cut + 3], anchored=False) == answers(oracle, s[cut : cut + 3], anchored=False)
    assert fm.count(fm.extend(fm.start(), 2_000_001)) == 0  # unknown token: dead state, no error


def test_skewed_large_alphabet_huffman_levels():
    """Zipf-distributed tokens over thousands of ids: codes of many lengths (levels that end early), the
    suffix sorter's recursion, and locate across every level, against the oracle."""
    rng = np.random.default_rng(11)
    seqs = [((rng.zipf(1.2, size=rng.integers(1, 12)) * 7) % 50_000).tolist() for _ in range(3000)]
    flat, lengths = flatten(seqs)
    fm, oracle = FMIndex.from_sequences(flat, lengths, sample_rate=5), NumpyIndex.from_sequences(flat, lengths)
    assert fm.native.levels > int(len(np.unique(flat))).bit_length()  # a Huffman shape: rare codes run deeper
    for s in seqs[:150]:
        for cut in (0, 1, 2, len(s)):
            assert answers(fm, s[:cut]) == answers(oracle, s[:cut])
        assert answers(fm, s[1:4], anchored=False) == answers(oracle, s[1:4], anchored=False)


def test_persisted_wide_ranges(tmp_path):
    """The widest ranges' next tokens are written at build time; a cleared cache answers from them (read-only
    views), identical to a traversal."""
    from grtool.index.kinds import FMIndex as Fm

    rng = np.random.default_rng(3)
    seqs = [[5, *rng.integers(10, 400, rng.integers(1, 6)).tolist(), 6] for _ in range(3000)]
    flat, lengths = flatten(seqs)
    params = Fm.write(tmp_path, flat, lengths)
    assert np.load(tmp_path / "fm_cache_ids.npy").size > 0
    index = Fm.load(tmp_path, {"params": params})
    oracle = NumpyIndex.from_sequences(flat, lengths)
    for prefix in ([], [5], [5, 10], [5, 11]):
        index.native.clear_cache()
        ids, counts = index.next_tokens(walk(index, prefix))
        want_ids, want_counts = oracle.next_tokens(walk(oracle, prefix))
        assert (ids.tolist(), counts.tolist()) == (want_ids.tolist(), want_counts.tolist()), prefix
    ids, counts = index.next_tokens(walk(index, [5]))
    assert len(ids) > 300 and not ids.flags.writeable and not counts.flags.writeable


def test_fm_index_from_before_huffman_levels_is_refused(tmp_path):
    from grtool.errors import InputError
    from grtool.index.kinds import FMIndex as Fm

    flat, lengths = flatten([[1, 2, 3], [1, 4]])
    params = Fm.write(tmp_path, flat, lengths)
    (tmp_path / "fm_tree.npy").unlink()
    with pytest.raises(InputError, match="rebuild it with `grtool index build`"):
        Fm.load(tmp_path, {"params": params})


def test_memory_limit_refuses_a_build_that_does_not_fit(tmp_path):
    from grtool.errors import GrtoolError
    from grtool.index.kinds import FMIndex as Fm
    from grtool.index.kinds import parse_bytes

    flat, lengths = flatten([[1, 2, 3]] * 1000)
    with pytest.raises(GrtoolError, match="more than --memory-limit 1M"):
        Fm.write(tmp_path, flat, lengths, memory_limit="1M")
    # the limit counts what this process holds already (a worker of the whole suite may hold a model): 256 MiB more fits
    import psutil

    assert Fm.write(tmp_path, flat, lengths, memory_limit=psutil.Process().memory_info().rss + 2**28)["n"] == 4000
    assert parse_bytes("1.5G") == 3 * 2**29 and parse_bytes("512MB") == 2**29 and parse_bytes(4096) == 4096


# ---------------------------------------------------------------------------------- save / load


def _holds(got, written) -> bool:
    """Every value of ``written`` is in ``got`` (objects compared key by key; ``got`` may hold more keys)."""
    if isinstance(written, dict):
        return isinstance(got, dict) and all(k in got and _holds(got[k], v) for k, v in written.items())
    return got == written


@pytest.mark.parametrize("kind", ["fm", "trie", "numpy"])
def test_save_load_round_trip(tmp_path, kind):
    from grtool.index.build import write_whole_index
    from grtool.index.tokenizer import load_tokenizer

    tok_json = tmp_path / "tok.json"
    _tiny_tokenizer().save(str(tok_json))
    tok = load_tokenizer(tok_json)
    rng = np.random.default_rng(1)
    seqs = [[tok.start_id, *rng.integers(0, 20, rng.integers(1, 9)).tolist(), tok.end_id] for _ in range(200)]
    seqs = [list(s) for s in dict.fromkeys(map(tuple, seqs))]
    flat, lengths = flatten(seqs)
    seq_docs = [[i % 7] if i % 5 else [i % 7, (i + 1) % 7] for i in range(len(seqs))]
    doc_ids = [f"doc{i}" for i in range(7)]
    meta = write_whole_index(tmp_path / "idx", kind=kind, flat=flat, lengths=lengths, seq_docs=seq_docs, doc_ids=doc_ids,
                       tokenizer=tok, source="docids", command=["grtool", "index", "build"])  # fmt: skip
    index = Index.open(tmp_path / "idx")
    # index.meta: the decoded record's JSON form, every value index.json holds (and the declared defaults besides)
    assert index.kind == kind and _holds(index.meta, json.loads((tmp_path / "idx" / "index.json").read_text()))
    for name, info in meta["files"].items():
        assert sha256_file(tmp_path / "idx" / name) == info["sha256"]
    assert meta["sizes"]["tokens"] == flat.size and meta["sizes"]["collisions"] == sum(len(d) > 1 for d in seq_docs)
    oracle = NumpyIndex.from_sequences(flat, lengths)
    for s in seqs[:50]:
        for cut in range(len(s) + 1):
            assert answers(index, s[:cut]) == answers(oracle, s[:cut])
    for i, s in enumerate(seqs):
        assert index.docs_of(s) == sorted(doc_ids[d] for d in seq_docs[i])
        assert index.docs_of(s[1:-1]) == index.docs_of(s)  # markers may be left out
    assert index.docs_of([tok.start_id, 999]) == []
    if kind == "fm":  # opened from memory maps, not copied
        assert isinstance(np.load(tmp_path / "idx" / "fm_levels.npy", mmap_mode="r"), np.memmap)
        assert meta["sizes"]["bits_per_token"] > 0
    with pytest.raises(Exception, match="exists"):
        write_whole_index(tmp_path / "idx", kind=kind, flat=flat, lengths=lengths, seq_docs=seq_docs, doc_ids=doc_ids, tokenizer=tok, source="docids")


def _tiny_tokenizer() -> Tokenizer:
    from tokenizers import models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(20)} | {"[UNK]": 20}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


# ------------------------------------------------------------------------ CLI on 2Wiki evidence triples


def _two_wiki_stage(tmp: Path) -> tuple[Path, list[dict]]:
    rows = two_wiki_rows()
    return write_triples_stage(tmp / "run" / "triples", rows), rows


@pytest.mark.parametrize("kind", ["fm", "trie"])
def test_query_matches_brute_force_on_2wiki(cli, tmp_path, kind):
    stage, rows = _two_wiki_stage(tmp_path)
    docs_by_docid: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        docs_by_docid[r["docid"]].add(r["doc_id"])
    assert any(len(d) > 1 for d in docs_by_docid.values()), "the fixture must hold shared triples"
    out = tmp_path / "index"
    built = json.loads(cli("index", "build", tmp_path / "run", "--tokenizer", "llama3", "--out", out, "--kind", kind, "--json").stdout)
    assert built["sequences"] == len(docs_by_docid) and built["collisions"] == sum(len(d) > 1 for d in docs_by_docid.values())
    # brute force with the tokenizer the index ships
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = {d: tok.encode(d, add_special_tokens=False).ids for d in docs_by_docid}
    start, end = tok.token_to_id("<docid_start>"), tok.token_to_id("<docid_end>")
    assert all(v[0] == start and v[-1] == end and start not in v[1:] and end not in v[:-1] for v in ids.values())
    prefixes = {(), (start,)}
    for docid in sorted(ids)[::4]:
        v = ids[docid]
        prefixes |= {tuple(v[:k]) for k in (2, 3, len(v) // 2, len(v) - 1, len(v))}
    prefixes.add((start, 999_999))
    index = Index.open(out)
    through_cli = sorted(prefixes)[:: max(1, len(prefixes) // 2)]  # two or three through the real CLI, all in-process
    for prefix in sorted(prefixes):
        if prefix in through_cli:
            args = ["--ids", ",".join(map(str, prefix))] if prefix else []
            got = json.loads(cli("index", "query", out, *args, "--json").stdout)
        else:
            got = json.loads(json.dumps(query(index, list(prefix))))
        want = brute_force(ids, docs_by_docid, list(prefix))
        assert got["prefix_ids"] == list(prefix)
        assert [(n["id"], n["count"]) for n in got["next"]] == want["next"], prefix
        assert all(n["text"] == tok.decode([n["id"]], skip_special_tokens=False) for n in got["next"])
        assert got["count"] == want["count"] and got["docs"] == want["docs"], prefix
    # every complete docid maps to exactly its documents
    for docid, v in ids.items():
        assert index.docs_of(v) == sorted(docs_by_docid[docid])
    # a text prefix is tokenized as inside a docid
    docid = sorted(ids)[0]
    text = docid[len("<docid_start>") :].split(",")[0] + ","
    by_text = json.loads(cli("index", "query", out, text, "--json").stdout)
    assert by_text["prefix_ids"] == ids[docid][: len(by_text["prefix_ids"])] and by_text["count"] >= 1


def test_memory_limit_on_the_command_line(cli, tmp_path):
    out = tmp_path / "idx"
    proc = cli("index", "build", "-", "--tokenizer", "qwen", "--memory-limit", "1K", "--out", out, input=BUNDLED.read_text(), check=False)
    assert proc.returncode != 0 and "--memory-limit 1K" in " ".join(proc.stderr.split())
    assert not out.exists()
    # a process of its own: the limit counts what the process holds already (the test worker holds more)
    cli("index", "build", "-", "--tokenizer", "qwen", "--memory-limit", "1G", "--out", out, input=BUNDLED.read_text(), process=True)
    assert Index.open(out).kind == "fm"


@pytest.fixture(scope="module")
def bundled_index(tmp_path_factory) -> Path:
    """The bundled triples (tests/data/index_triples.jsonl) indexed through the real CLI from stdin (qwen)."""
    from conftest import run_cli

    out = tmp_path_factory.mktemp("bundled") / "idx"
    run_cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, input=BUNDLED.read_text())
    return out


def test_build_from_stdin_documents_source_and_stats(cli, tmp_path, bundled_index):
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    out = bundled_index
    stats = json.loads(cli("index", "stats", out, "--json").stdout)
    distinct = {r["docid"] for r in rows}
    assert stats["kind"] == "fm" and stats["sequences"] == len(distinct) and stats["documents"] == 4
    assert stats["collisions"] == 3 and stats["tokenizer"]["docid_start_id"] == 151851 and stats["bits_per_token"] > 0
    assert stats["command"][:3] == ["grtool", "index", "build"]
    arrays = stats["arrays"]  # where the bytes go, per search array
    assert arrays["fm_levels"]["bytes"] > 0 and sum(a["bytes"] for a in arrays.values()) == stats["index_bytes"]
    got = json.loads(cli("index", "query", out, "Old Harbor Bridge, designed by, Irmgard Voß<docid_end>", "--json").stdout)
    assert got["docs"] == ["d-harbor", "d-voss"] and got["next"] == [] and got["count"] == 1
    got = json.loads(cli("index", "query", out, "Old Harbor Bridge,", "--json").stdout)
    assert got["count"] == 3 and got["docs"] == []
    # the human-readable table
    assert "next tokens" in cli("index", "query", out, "Kiel").stderr + cli("index", "query", out, "Kiel").stdout
    # documents source: whole texts, substring search through the FM API (text taken as it is)
    doc_stage = tmp_path / "documents"
    from grtool.store.schemas import DOCUMENTS

    stage = StageWriter(doc_stage, StageSpec("documents", DOCUMENTS))
    texts = {"a": ("Kiel", "Kiel is a port city on the Baltic Sea."), "b": ("Lübeck", "Lübeck lies on the Trave, near the Baltic Sea.")}
    with stage.shard(0) as sh:
        sh.count_in(2)
        sh.write_rows([{"doc_id": k, "title": t, "text": x, "datasets": ["test"]} for k, (t, x) in texts.items()])
    stage.finish()
    cli("index", "build", doc_stage, "--tokenizer", "qwen", "--source", "documents", "--out", tmp_path / "docs_idx")
    index = Index.open(tmp_path / "docs_idx")
    needle = index.tokenizer.encode(" Baltic Sea")
    state = index.start(anchored=False)
    for t in needle:
        state = index.extend(state, t)
    assert index.count(state) == 2 and sorted(index.locate(state, 10)[:, 0].tolist()) == [0, 1]
    assert index.docs_of(index.tokenizer.encode("Kiel: Kiel is a port city on the Baltic Sea.")) == ["a"]


def test_query_text_is_a_whole_docid_unless_a_prefix(cli, bundled_index):
    """Issue #26: a docid typed as text returned documents only with a literal <docid_end> appended, and a
    trailing space gave 0 matches. Whole docid first (spaces around it do not matter); --prefix reads it as a
    prefix; the output says which reading was used."""
    docid = "Old Harbor Bridge, designed by, Irmgard Voß"
    got = json.loads(cli("index", "query", bundled_index, docid, "--json").stdout)
    assert got["docs"] == ["d-harbor", "d-voss"] and got["flipped"] is False and got["read_as"] == "docid"
    assert got["text"] == "<docid_start>" + docid + "<docid_end>"
    from grtool.index.query import query_text

    index = Index.open(bundled_index)
    for typed in (f"  {docid} ", f"<docid_start>{docid}", f"{docid}<docid_end>\n"):
        assert {**query_text(index, typed), "titles": {}} == got  # built from stdin: no corpus to title its documents
    # --prefix: the same text as a prefix, whose one continuation is the end marker
    pre = json.loads(cli("index", "query", bundled_index, docid + " ", "--prefix", "--json").stdout)
    assert pre["read_as"] == "prefix" and pre["docs"] == [] and [n["text"] for n in pre["next"]] == ["<docid_end>"]
    # not a whole docid: a prefix, a trailing space dropped (the next tokens carry their own)
    part = query_text(index, "Old Harbor Bridge, ")
    assert part["read_as"] == "prefix" and part["count"] == 3 and part == query_text(index, "Old Harbor Bridge,")
    assert query_text(index, "Old Harbor Bridge, designed by, Nobody<docid_end>")["read_as"] == "docid"
    assert query_text(index, "Old Harbor Bridge, designed by, Nobody<docid_end>")["docs"] == []
    # the human-readable answer names the reading and the documents
    text = cli("index", "query", bundled_index, docid + " ")
    assert "whole docid" in text.stderr + text.stdout and "d-harbor, d-voss" in text.stderr + text.stdout


def test_bad_input_is_reported_with_file_and_record(cli, tmp_path):
    def run(*args, check=True):  # wide terminal: Rich does not wrap the one-line errors
        return cli(*args, check=check, env={"COLUMNS": "500"})

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    rows[5]["docid"] = "Irmgard Voß, occupation, civil engineer"  # markers missing
    stage = write_triples_stage(tmp_path / "triples", rows)
    err = run("index", "build", stage, "--tokenizer", "qwen", "--out", tmp_path / "idx", check=2).stderr
    assert "part-00000.parquet, row 6" in err and "not '<docid_start>head" in err
    assert not (tmp_path / "idx").exists() and not list(tmp_path.glob(".idx*"))
    assert "not an index directory" in run("index", "query", tmp_path, "--ids", "1", check=2).stderr
    assert "no 'triples' stage directory" in run("index", "build", tmp_path / "nope", "--tokenizer", "qwen", "--out", tmp_path / "i2", check=2).stderr
    rows[5]["docid"] = "<docid_start>Irmgard Voß, occupation, civil engineer<docid_end>"
    good = write_triples_stage(tmp_path / "good", rows)
    run("index", "build", good, "--tokenizer", "qwen", "--out", tmp_path / "idx")
    # an identical re-run is "up to date" (tests/index/test_index_rerun.py); another --kind needs --overwrite
    assert "exists, built with a different --kind" in run("index", "build", good, "--tokenizer", "qwen", "--out", tmp_path / "idx", "--kind", "trie", check=2).stderr
    run("index", "build", good, "--tokenizer", "qwen", "--out", tmp_path / "idx", "--kind", "trie", "--overwrite")
    assert Index.open(tmp_path / "idx").kind == "trie"
    assert "expected comma-separated" in run("index", "query", tmp_path / "idx", "--ids", "a,b", check=2).stderr
