"""Indexes of generated docid sets reopen, pass their checks and answer as brute force says (issue #44), with every
kind of tokenizer: the built-ins llama3 and qwen, a folder whose docid markers are the highest ids (as a `train sft`
checkpoint's are) and the embedded model's byte-level GGUF; fm and trie.

The FM-index sorts n + 1 rows, row 0 the empty suffix, so the row of the whole text (``params.dollar_row``) is n
whenever the whole text is the largest suffix: one docid whose end marker is the highest id, or a last docid whose
reversed tokens sort last. The record once refused that row, so `index build` failed on indexes it had just built;
the three ways users met it are the regressions below."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import run_cli
from grtool.docid import DOCID_END, DOCID_START, normalize
from grtool.index.base import Index
from grtool.index.query import query
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter

FIRST = ("Alder", "Ash", "Birch", "Cedar", "Elm", "Fir", "Hazel", "Larch", "Maple", "Oak", "Pine", "Rowan", "Spruce", "Willow", "Yew")
SECOND = ("Bridge", "Castle", "Church", "Dam", "Gate", "Hall", "Harbor", "Lake", "Mill", "Park", "Port", "Quay", "River", "Road", "School",
          "Station", "Street", "Tower", "Valley", "Well")  # fmt: skip
RELATIONS = ("crosses", "designed by", "opened in", "located in")
TAILS = ("Kiel", "Lübeck", "Irmgard Voß", "São Paulo", "1911", "Baltic Sea")
LAST_WORD = "Zenith"  # the highest content id of the marker-top vocabulary
DOC_IDS = ("d-a", "d-b", "d-c", "d-d")
TOKENIZERS = ("llama3", "qwen", "markers-at-top", "gguf")


def render(head: str, relation: str, tail: str) -> str:
    return f"{DOCID_START}{head}, {relation}, {tail}{DOCID_END}"


def triple_rows(triples: list[tuple[str, str, str, str]]) -> list[dict]:
    """Triples-stage rows, ``(head, relation, tail, doc_id)`` each, numbered within their document."""
    seen: Counter[str] = Counter()
    rows = []
    for h, r, t, doc in triples:
        rows.append({"doc_id": doc, "idx": seen[doc], "head": h, "relation": r, "tail": t, "docid": render(h, r, t)})
        seen[doc] += 1
    return rows


def write_triples(path: Path, rows: list[dict]) -> Path:
    stage = StageWriter(path, StageSpec("triples", TRIPLES, params={"test": True}))
    with stage.shard(0) as sh:
        sh.count_in(len(rows))
        sh.write_rows(rows)
    stage.finish()
    return path


def marker_top_tokenizer(folder: Path) -> Path:
    """A tokenizer folder as `train sft` leaves one: a word-level vocabulary (every word of this file's docids, in
    the order above, ``Zenith`` last) with the two docid markers added after it, the highest ids."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = [",", *FIRST, *SECOND, *dict.fromkeys(w for text in (*RELATIONS, *TAILS) for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text)), LAST_WORD]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([*words, "[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in (DOCID_START, DOCID_END)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def specs(tmp_path_factory) -> dict[str, str]:
    """--tokenizer of each kind: the built-ins, the marker-top folder, the embedded model's GGUF file."""
    from grtool.models import embedded_gguf

    folder = marker_top_tokenizer(tmp_path_factory.mktemp("checkpoint") / "tokenizer")
    return {"llama3": "llama3", "qwen": "qwen", "markers-at-top": str(folder), "gguf": str(embedded_gguf())}


@pytest.fixture(scope="module")
def loaded(specs):
    """Each tokenizer loaded once (a 128K vocabulary takes seconds); the index's own tokenizer.json is checked to
    be the same one (its digest) before it stands in for it."""
    from grtool.index.tokenizer import load_tokenizer

    return {name: load_tokenizer(spec) for name, spec in specs.items()}


# ------------------------------------------------------------------------------------------- brute force


def expected_docs(rows: list[dict]) -> dict[str, list[str]]:
    """Each docid string → the documents its triple is in: every spelling of one triple (its normalized text) maps
    to the documents of them all."""
    by_key: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        by_key[normalize(f"{r['head']}, {r['relation']}, {r['tail']}")].add(r["doc_id"])
    return {r["docid"]: sorted(by_key[normalize(f"{r['head']}, {r['relation']}, {r['tail']}")]) for r in rows}


def brute_force(ids: dict[str, list[int]], docs: dict[str, list[str]], prefix: list[int]) -> dict:
    """What `index query` answers for ``prefix`` (anchored at a docid's start), from the docids' token ids alone."""
    under = [d for d, v in ids.items() if v[: len(prefix)] == prefix]
    following = Counter(ids[d][len(prefix)] for d in under if len(ids[d]) > len(prefix))
    whole = [d for d in under if len(ids[d]) == len(prefix)]
    return {"next": sorted(following.items()), "count": len(under), "docs": sorted({x for d in whole for x in docs[d]})}


def probes(ids: dict[str, list[int]], start: int) -> set[tuple[int, ...]]:
    """The empty prefix, the marker alone, prefixes of every docid at several cuts and whole, a miss."""
    found = {(), (start,), (start, max(t for v in ids.values() for t in v) + 1)}
    for v in ids.values():
        found |= {tuple(v[:k]) for k in (2, 3, len(v) // 2, len(v) - 1, len(v))}
    return found


def check_answers(index: Index, rows: list[dict], tok) -> None:
    """The record's sizes (at their edges: one docid is the longest sequence and all the tokens, every docid a
    collision), every probe through `query` and every whole docid through `docs_of`, against brute force."""
    docs = expected_docs(rows)
    ids = {d: tok.encode(d) for d in docs}
    assert all(v[0] == index.start_id and v[-1] == index.end_id for v in ids.values())
    s = index.record.sizes
    assert (s.sequences, s.tokens, s.max_sequence_tokens) == (len(ids), sum(map(len, ids.values())), max(map(len, ids.values())))
    assert (s.collisions, s.documents) == (sum(len(d) > 1 for d in docs.values()), len({r["doc_id"] for r in rows}))
    for prefix in sorted(probes(ids, index.start_id)):
        got = query(index, list(prefix))
        want = brute_force(ids, docs, list(prefix))
        assert ([(n["id"], n["count"]) for n in got["next"]], got["count"], got["docs"]) == (want["next"], want["count"], want["docs"]), prefix
    for docid, v in ids.items():
        assert index.docs_of(v) == docs[docid] == index.docs_of(v[1:-1]), docid


def open_checked(out: Path, tok=None) -> Index:
    """The library's open path (the record's bounds and every check against the files); ``tok``: the tokenizer
    the index was built with, standing in for its tokenizer.json (the same file, by digest)."""
    index = Index.open(out)
    record = index.record
    if tok is not None:
        assert record.tokenizer.sha256 == tok.fingerprint()
        index.__dict__["tokenizer"] = tok
    if record.kind == "fm":
        assert 1 <= record.params.dollar_row <= record.params.n
    return index


# --------------------------------------------------------------------------------------- property test

triples = st.lists(st.tuples(st.sampled_from(FIRST[:4]), st.sampled_from(SECOND[:4]), st.sampled_from(RELATIONS), st.sampled_from(TAILS),
                             st.sampled_from(DOC_IDS), st.booleans()), min_size=1, max_size=12)  # fmt: skip
ONE = [("Oak", "Bridge", "crosses", "Kiel", "d-a", False)]
REPEATED = [*ONE, ("Oak", "Bridge", "crosses", "Kiel", "d-b", False), *ONE, ("Oak", "Bridge", "crosses", "Kiel", "d-c", True)]


@pytest.mark.parametrize("kind", ["fm", "trie"])
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@settings(max_examples=4, derandomize=True, database=None, deadline=None)
@given(drawn=triples)
@example(drawn=ONE)
@example(drawn=REPEATED)
def test_an_index_of_any_docids_reopens_and_answers_as_brute_force(loaded, tmp_path_factory, tokenizer, kind, drawn):
    """``drawn``: (first word, second word, relation, tail, document, spelled with a space before the comma):
    one docid, the same docid in several documents and repeated, spellings of one triple, several docids."""
    from grtool.index.build import read_docids, tokenize, write_whole_index

    rows = triple_rows([(f"{a} {b}" + (" " if spaced else ""), r, t, doc) for a, b, r, t, doc, spaced in drawn])
    tok = loaded[tokenizer]
    root = Path(tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    try:
        # the library's build: read_docids + tokenize + write_index (the streamed `index build` writes the same
        # files, tests/index/test_index_stream.py; the CLI builds below take that path)
        read = read_docids(write_triples(root / "triples", rows))
        flat, lengths = tokenize(tok, read.docids)
        write_whole_index(root / "idx", kind=kind, flat=flat, lengths=lengths, seq_docs=read.seq_docs, doc_ids=read.doc_ids, tokenizer=tok,
                    source="docids", docids=read.docids)  # fmt: skip
        index = open_checked(root / "idx", tok)
        if kind == "fm" and index.record.sizes.sequences == 1:  # each tokenizer's end marker is its highest id
            assert index.record.params.dollar_row == index.record.params.n  # the whole text sorts last: the edge
        check_answers(index, rows, tok)
    finally:
        shutil.rmtree(root)


# ------------------------------------------------------------------------- through the CLI, every tokenizer


def _query_cli(out: Path, rows: list[dict], docid: str) -> None:
    got = json.loads(run_cli("index", "query", out, docid, "--json").stdout)
    assert got["read_as"] == "docid" and got["docs"] == expected_docs(rows)[docid]


@pytest.mark.parametrize(("tokenizer", "kind"), [("qwen", "trie"), ("default", "fm")])
def test_index_build_from_standard_input_validates_and_answers(tmp_path, tokenizer, kind):
    """`index build -` with the built-in qwen and the embedded model by name (its GGUF file)."""
    rows = triple_rows([("Oak Bridge", "crosses", "Kiel", "d-a"), ("Oak Bridge", "crosses", "Kiel", "d-b"), ("Elm Tower", "opened in", "1911", "d-a")])
    out = tmp_path / "idx"
    run_cli("index", "build", "-", "--tokenizer", tokenizer, "--kind", kind, "--out", out, input="".join(json.dumps(r) + "\n" for r in rows))
    run_cli("validate", out)
    _query_cli(out, rows, rows[0]["docid"])
    check_answers(open_checked(out), rows, Index.open(out).tokenizer)


# ------------------------------------------------------------------ the three regressions of the issue


def test_one_docid_from_standard_input_with_llama3(tmp_path):
    """The whole text of one docid is its largest suffix (the end marker is llama3's highest id): row n."""
    rows = triple_rows([("Kiel", "located in", "Baltic Sea", "d-a")])
    out = tmp_path / "idx"
    run_cli("index", "build", "-", "--tokenizer", "llama3", "--out", out, input=json.dumps(rows[0]) + "\n")
    params = json.loads((out / "index.json").read_text())["params"]
    assert params["dollar_row"] == params["n"]
    run_cli("validate", out)
    _query_cli(out, rows, rows[0]["docid"])


def test_the_index_stage_of_a_small_pipeline(tmp_path, write_pipeline):
    rows = triple_rows([("Oak Bridge", "crosses", "Kiel", "d-a")])
    triples = write_triples(tmp_path / "triples", rows)
    config = write_pipeline([{"name": "index", "run": "index build", "args": [triples], "options": {"tokenizer": "llama3", "out": "{out}/index"}}],
                            out=tmp_path / "run")  # fmt: skip
    run_cli("pipeline", "run", config)
    out = tmp_path / "run" / "index"
    params = json.loads((out / "index.json").read_text())["params"]
    assert params["dollar_row"] == params["n"]
    run_cli("validate", tmp_path / "run")
    _query_cli(out, rows, rows[0]["docid"])


def test_a_few_hundred_docids_with_the_markers_the_highest_ids(specs, tmp_path):
    """300 docids, each in one or two documents; the docid that sorts last ends in the highest word, so with the
    end marker the highest id the whole text is the largest suffix."""
    heads = [f"{a} {b}" for a in FIRST for b in SECOND]
    triples = [(h, RELATIONS[i % 4], TAILS[i % 6], DOC_IDS[i % 4]) for i, h in enumerate(heads[:-1])]
    triples += [(h, r, t, DOC_IDS[(i + 1) % 4]) for i, (h, r, t, _) in enumerate(triples[::7])]  # collisions
    triples.append((heads[-1], "located in", LAST_WORD, "d-a"))
    rows = triple_rows(triples)
    out = tmp_path / "idx"
    run_cli("index", "build", write_triples(tmp_path / "triples", rows), "--tokenizer", specs["markers-at-top"], "--out", out)
    record = json.loads((out / "index.json").read_text())
    assert record["tokenizer"]["docid_end_id"] == record["tokenizer"]["vocab_size"] - 1 and record["sizes"]["sequences"] == 300
    assert record["params"]["dollar_row"] == record["params"]["n"]
    run_cli("validate", out)
    _query_cli(out, rows, rows[-1]["docid"])
    check_answers(open_checked(out), rows, Index.open(out).tokenizer)
