"""Bracket-mode docid constraint (grtool.index.text_constraint) with the three built-in tokenizers.

Every check compares against a plain byte-by-byte reference over the whole vocabulary, or walks the
constraint and checks that every text between brackets is exactly one docid.
"""

from __future__ import annotations

import json
import random
import re
import time

import numpy as np
import pytest

from conftest import TEST_DATA
from grtool.index.decoding import Forbidden
from grtool.index.text_constraint import BracketConstraint, token_bytes

DOCIDS = [line for line in (TEST_DATA / "bracket_docids.txt").read_text(encoding="utf-8").splitlines() if line]
NAMES = ("default", "llama3", "qwen")
TEXTS = [
    "Zürich lies on Lake Zürich; Nguyễn Phú Trọng was born in Hanoi.",
    "Facts: [Barack Obama, born in, Honolulu], [Star Wars, director, George Lucas].\n\n",
    '  ["quoted"] [The Magic Flute] ],\t]. Москва 北京 Αθήνα — 5199 m ✓',
    "Frédéric Chopin, Żelazowa Wola, São Paulo, Reykjavík, Tōkyō",
]


@pytest.fixture(scope="module", params=NAMES)
def setup(request):
    """(tokenizer, token bytes, constraint over the bundled docids) per built-in tokenizer."""
    from grtool.index.tokenizer import load_tokenizer

    tok = load_tokenizer(request.param).tokenizer
    vocab = token_bytes(tok)
    return tok, vocab, BracketConstraint(DOCIDS, vocab)


# ------------------------------------------------------------------------------------------ reference


DOC_SET = {d.encode() for d in DOCIDS}
PREFIXES = {d.encode()[:k] for d in DOCIDS for k in range(len(d.encode()) + 1)}
BAD = object()


def ref_feed(state, data: bytes):
    """Byte by byte, the state after data, or BAD (independent of the bisect implementation)."""
    for b in data:
        c = bytes([b])
        if state is None:
            state = b"" if c == b"[" else None
        elif c == b"[":
            return BAD
        elif c == b"]":
            if state not in DOC_SET:
                return BAD
            state = None
        else:
            state += c
            if state not in PREFIXES:
                return BAD
    return state


def ref_inside(vocab, p: bytes) -> np.ndarray:
    return np.array([i for i, b in enumerate(vocab) if b and ref_feed(p, b) is not BAD], dtype=np.int64)


def ref_forbidden_free(vocab) -> np.ndarray:
    return np.array([i for i, b in enumerate(vocab) if b and ref_feed(None, b) is BAD], dtype=np.int64)


def ids_of(vocab, text: str) -> list[int]:
    return [i for i, b in enumerate(vocab) if b == text.encode()]


# ------------------------------------------------------------------------------------------ token bytes


def test_token_bytes_round_trip(setup):
    tok, vocab, _ = setup
    assert len(vocab) == tok.get_vocab_size(with_added_tokens=True)
    for text in TEXTS + DOCIDS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert b"".join(vocab[i] for i in ids) == text.encode(), text
    # Control tokens are never text.
    for special in ("<docid_start>", "<docid_end>"):
        assert vocab[tok.token_to_id(special)] is None


def test_token_bytes_metaspace_byte_fallback():
    """A SentencePiece-style tokenizer: ▁ is a space, <0xNN> is that byte, <s> is special."""
    from tokenizers import Tokenizer

    pieces = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xBC>", "▁Z", "rich", "▁", "▁[", "],"]
    config = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True} for i, c in enumerate(pieces[:3])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        "post_processor": None,
        "decoder": {
            "type": "Sequence",
            "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {p: i for i, p in enumerate(pieces)},
            "merges": [],
        },
    }
    vocab = token_bytes(Tokenizer.from_str(json.dumps(config)))
    assert vocab == [None, None, None, b"\xc3", b"\xbc", b" Z", b"rich", b" ", b" [", b"],"]
    assert b"".join(vocab[i] for i in (5, 3, 4, 6)) == " Zürich".encode()


# ------------------------------------------------------------------------------------------ allowed sets


def test_free_state_forbids_exactly_the_bad_openers(setup):
    _, vocab, c = setup
    forbidden = c.allowed(None)
    assert isinstance(forbidden, Forbidden)
    assert np.array_equal(np.sort(forbidden.ids), ref_forbidden_free(vocab))
    assert set(c.openers.tolist()) == {i for i, b in enumerate(vocab) if b and b"[" in b}
    assert c.is_free(None) and not c.is_free(b"")


@pytest.mark.parametrize(
    "prefix",
    [
        "",  # right after [
        "B",
        "Barack Obama, b",
        "Barack Obama, born in, Honolulu",  # complete: only ] tokens
        "Mount Kenya, elevation, 5199",  # complete and a prefix of "… 5199 metres"
        "Zü",
        "Nguy",
        "北",
        "Isaac Newton, educated at, Trinity College",  # the tail itself has a comma
    ],
)
def test_inside_matches_reference(setup, prefix):
    _, vocab, c = setup
    got = c.allowed(prefix.encode())
    assert isinstance(got, np.ndarray)
    assert np.array_equal(got, ref_inside(vocab, prefix.encode())), prefix
    # Never a special token, never a [ before the docid closes (`][` may open the next one).
    assert not any(vocab[i] is None or b"[" in vocab[i].split(b"]", 1)[0] for i in got)


def test_partial_utf8_prefix_continues_with_the_missing_bytes(setup):
    """A docid character may span tokens: after the first byte of ü only its second byte (alone or merged) fits."""
    _, vocab, c = setup
    p = "Z".encode() + "ü".encode()[:1]
    got = c.allowed(p)
    assert len(got) and all(vocab[i].startswith("ü".encode()[1:]) for i in got)
    assert np.array_equal(got, ref_inside(vocab, p))


def test_unknown_prefix_can_only_close(setup):
    _, vocab, c = setup
    assert set(c.allowed(b"Qzx").tolist()) == set(ids_of(vocab, "]")) != set()


def test_merged_open_tokens(setup):
    """` [`, `["`, `[The`-style tokens are allowed in free text exactly when what follows [ starts a docid."""
    _, vocab, c = setup
    banned = set(c.allowed(None).ids.tolist())
    space_open = ids_of(vocab, " [")
    assert space_open and not banned & set(space_open)
    seen = {True: [], False: []}
    for i, b in enumerate(vocab):
        m = re.fullmatch(rb'[^\[\]]*\[([A-Za-z"]+)', b or b"")
        if m:
            starts = any(d.startswith(m.group(1)) for d in DOC_SET)
            assert (i not in banned) == starts, b
            seen[starts].append(b)
    assert b'["' in seen[False]  # no docid starts with a quote
    if any(re.search(rb"\[[A-Z]", b) for b in seen[True] + seen[False]):  # SmolLM2 has no [Letter tokens
        assert seen[True] and seen[False], seen
        print(f"\n[-letter tokens: allowed {[b for b in seen[True] if len(b) > 3][:6]} …, forbidden {[b for b in seen[False] if len(b) > 3][:6]} …")


def test_merged_close_tokens(setup):
    """`],` / `].` / `]\\n` are allowed exactly when the docid is complete."""
    _, vocab, c = setup
    merged = [i for t in ("],", "].", "]\n") for i in ids_of(vocab, t)]
    assert merged
    done, partial = c.allowed(b"Star Wars, director, George Lucas"), c.allowed(b"Star Wars, director, George Luca")
    assert set(merged) <= set(done.tolist())
    assert not set(merged) & set(partial.tolist())


# ------------------------------------------------------------------------------------------ walks


def _walk(c: BracketConstraint, vocab, rng: random.Random, state=None, max_steps=400) -> bytes:
    """From free: open with a random allowed [-token, then random allowed tokens until free again."""
    banned = set(c.allowed(None).ids.tolist())
    out = []
    if state is None:
        t = rng.choice([i for i in c.openers.tolist() if i not in banned])
        out.append(vocab[t])
        state = c.advance(state, t)
    for _ in range(max_steps):
        if c.is_free(state):
            return b"".join(out)
        allowed = c.allowed(state)
        if isinstance(allowed, Forbidden):  # a ]-token reopened a docid: keep walking from free
            t = rng.choice([i for i in c.openers.tolist() if i not in banned])
        else:
            t = int(rng.choice(allowed.tolist()))
        out.append(vocab[t])
        state = c.advance(state, t)
    raise AssertionError(f"walk did not close: {b''.join(out)!r}")


def _spans(text: bytes) -> list[bytes]:
    """The texts between each [ and the ] that closes it (a ] in free text is just text)."""
    spans, inside = [], None
    for b in text:
        c = bytes([b])
        if inside is None:
            inside = b"" if c == b"[" else None
        elif c == b"]":
            spans.append(inside)
            inside = None
        else:
            assert c != b"[", text
            inside += c
    assert inside is None, text
    return spans


def test_random_walks_write_only_docids(setup):
    _, vocab, c = setup
    rng = random.Random(7)
    written = set()
    for _ in range(250):
        text = _walk(c, vocab, rng)
        spans = _spans(text)
        assert spans and len(spans) == text.count(b"["), text  # every [ was closed
        assert all(s in DOC_SET for s in spans), text
        written.update(spans)
    assert len(written) > 20  # the walks reach many docids, not one


def test_prompt_ending_inside_a_docid(setup):
    tok, vocab, c = setup
    prompt = tok.encode("Known facts: [Star Wars, director, George Lucas]. And: [Barack Obama, born in, Hon", add_special_tokens=False).ids
    state = c.initial(prompt)
    assert state == b"Barack Obama, born in, Hon"
    rng = random.Random(1)
    for _ in range(20):
        text = b"[" + state + _walk(c, vocab, rng, state=state)
        assert re.match(rb"\[([^\[\]]*)\]", text).group(1) == b"Barack Obama, born in, Honolulu"
    assert c.initial(tok.encode("[Star Wars, director, George Lucas] and", add_special_tokens=False).ids) is None
    # A prefix no docid has (written by the prompt) can only be closed.
    unknown = c.initial(tok.encode("see [Qzx", add_special_tokens=False).ids)
    assert set(c.allowed(unknown).tolist()) == set(ids_of(vocab, "]"))
    # A special token (end of a chat turn) ends an unclosed docid.
    end = tok.token_to_id("<docid_end>")
    assert c.advance(b"Barack", end) is None


# ------------------------------------------------------------------------------------------ plumbing


def test_mask_row_forbidden():
    import torch

    from grtool.index.decoding import mask_row

    row = torch.zeros(5)
    mask_row(row, Forbidden(np.array([1, 3, 9], dtype=np.int64)))  # 9 is past the row's width
    assert row.tolist() == [0, float("-inf"), 0, float("-inf"), 0]
    row = torch.arange(5, dtype=torch.float)
    mask_row(row, np.array([0, 4, 7], dtype=np.int64))
    assert row.tolist() == [0, float("-inf"), float("-inf"), float("-inf"), 4]


def test_from_index_reads_docids_and_caches(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grtool.index.tokenizer import load_tokenizer

    pq.write_table(pa.table({"docid": [f"<docid_start>{d}<docid_end>" for d in DOCIDS[:30]]}), tmp_path / "docids.parquet")
    tok = load_tokenizer("default")
    c = BracketConstraint.from_index(tmp_path, tok.tokenizer)
    assert list(c.docs) == sorted(d.encode() for d in DOCIDS[:30])
    assert BracketConstraint.from_index(str(tmp_path), tok) is c  # same path and tokenizer: the same object


def test_speed_report():
    """Not a timed assert: prints µs per allowed() over ~5,000 docids (run with -s)."""
    from grtool.index.tokenizer import load_tokenizer

    trip = [d.split(", ", 2) for d in DOCIDS]
    heads, rels, tails = (sorted({t[k] for t in trip}) for k in range(3))
    rng = random.Random(0)
    many = set(DOCIDS)
    while len(many) < 5000:
        many.add(f"{rng.choice(heads)}, {rng.choice(rels)}, {rng.choice(tails)}")
    for name in ("default", "llama3"):
        c = BracketConstraint(many, token_bytes(load_tokenizer(name).tokenizer))
        timings = {}
        for label, p in (("empty prefix, first", b""), ("empty prefix, cached", b""), ("mid-docid, first", b"Marie Curie, award rec"), ("mid-docid, cached", b"Marie Curie, award rec")):
            t0 = time.perf_counter()
            n = 1 if "first" in label else 1000
            for _ in range(n):
                c.allowed(p)
            timings[label] = (time.perf_counter() - t0) / n * 1e6
        # A realistic mix: random walks through docids with a cold cache, per step advance + allowed.
        c._allowed_inside.cache_clear()
        walk_rng, steps, t0 = random.Random(3), 0, time.perf_counter()
        for _ in range(100):
            state = c.advance(None, c.openers[0])
            while not c.is_free(state) and steps < 100000:
                allowed = c.allowed(state)
                state = c.advance(state, allowed[walk_rng.randrange(len(allowed))] if isinstance(allowed, np.ndarray) else c.openers[0])
                steps += 1
        timings["walk step, cold cache"] = (time.perf_counter() - t0) / steps * 1e6
        print(f"\n{name} ({len(many)} docids): " + ", ".join(f"{k} {v:.1f} µs" for k, v in timings.items()))
