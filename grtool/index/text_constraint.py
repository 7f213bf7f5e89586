"""Hybrid docid decoding in bracket mode: ``[`` opens a docid, ``]`` closes it, judged on the docid TEXT.

Off-the-shelf models write docids as ``[Barack Obama, born in, Honolulu]``. Their tokenizers merge the
brackets with neighbours (`` [``, ``["``, ``[The``, ``],``, ``].``), so a token cannot be judged by the ids
of a standalone tokenization of the docid: :class:`BracketConstraint` judges each candidate token by the
bytes it would add to the docid text. Everything works on UTF-8 bytes, because one character may need
several byte tokens.

A state is ``None`` outside a docid and the ``bytes`` written since the ``[`` inside one (cheap, hashable).
The allowed set inside a docid is found by walking the sorted docid byte strings (bisect) jointly with the
sorted token byte strings, descending only where both sides continue, so a step never scans the vocabulary;
results are cached per prefix.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from bisect import bisect_left
from pathlib import Path
from typing import Iterable

import numpy as np

from grtool.errors import InputError
from grtool.index.decoding import Forbidden
from grtool.index.docid_bytes import DocidBytes, open_docid_bytes

_BAD = object()  # an impossible continuation (never a state)
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# ------------------------------------------------------------------------------------------ token bytes


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _decoders(node) -> list[dict]:
    """Every decoder in a (possibly nested Sequence) decoder config."""
    if not isinstance(node, dict):
        return []
    return [node] + [d for sub in node.get("decoders") or [] for d in _decoders(sub)]


def _unwrap(tokenizer):
    """A ``tokenizers.Tokenizer`` from it, a transformers fast tokenizer or a grtool DocidTokenizer."""
    for attr in ("backend_tokenizer", "tokenizer"):
        inner = getattr(tokenizer, attr, None)
        if inner is not None and hasattr(inner, "get_vocab"):
            return inner
    return tokenizer


def token_bytes(tokenizer) -> list[bytes | None]:
    """Per token id, the bytes the token adds to decoded text mid-sequence; None for special tokens.

    ByteLevel tokenizers (GPT-2 style) invert the byte → character map; Metaspace/SentencePiece ones read
    ``▁`` as a space and ``<0xNN>`` byte-fallback tokens as that byte. Mid-sequence means the Metaspace
    decoder's stripping of the first token's leading space is not applied.
    """
    tok = _unwrap(tokenizer)
    config = json.loads(tok.to_str())
    decoders = _decoders(config.get("decoder"))
    kinds = {d.get("type") for d in decoders}
    model = config.get("model") or {}
    size = tok.get_vocab_size(with_added_tokens=True)
    out: list[bytes | None] = [None] * size
    added = tok.get_added_tokens_decoder()

    if "ByteLevel" in kinds:
        inverse = {c: b for b, c in _bytes_to_unicode().items()}

        def convert(piece: str) -> bytes:
            try:
                return bytes(map(inverse.__getitem__, piece))
            except KeyError:  # not in a ByteLevel alphabet (does not happen in real vocabs): keep it as UTF-8
                return b"".join(bytes([inverse[c]]) if c in inverse else c.encode() for c in piece)
    else:
        space = None
        for d in decoders:
            if d.get("type") == "Metaspace":
                space = d.get("replacement", "▁")
            elif d.get("type") == "Replace" and (d.get("content") == " "):
                space = (d.get("pattern") or {}).get("String", space)
        if space is None:
            raise InputError(f"token_bytes: unsupported tokenizer decoder {', '.join(sorted(k for k in kinds if k)) or 'none'} (ByteLevel or Metaspace/SentencePiece expected)")
        fallback = bool(model.get("byte_fallback")) or "ByteFallback" in kinds

        def convert(piece: str) -> bytes:
            m = _BYTE_FALLBACK.fullmatch(piece) if fallback else None
            return bytes([int(m.group(1), 16)]) if m else piece.replace(space, " ").encode()

    for piece, i in tok.get_vocab(with_added_tokens=False).items():
        if i < size:
            out[i] = convert(piece)
    for i, a in added.items():
        # Special/control tokens never belong to a docid; other added tokens decode to their content.
        out[i] = None if a.special else a.content.encode()
    return out


# ------------------------------------------------------------------------------------------ the constraint


class _Vocab:
    """What a constraint needs of a vocabulary, shared by every constraint over it (built once per vocabulary)."""

    def __init__(self, vocab: list[bytes | None], ob: bytes):
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab):
            if b:  # empty tokens would never advance a docid
                by_bytes.setdefault(b, []).append(i)
        self.ids = {b: np.array(ids, dtype=np.int64) for b, ids in by_bytes.items()}
        self.toks = sorted(by_bytes)  # distinct token byte strings, for prefix bisects
        self.openers = np.array([i for i, b in enumerate(vocab) if b and ob in b], dtype=np.int64)


_VOCABS: dict[tuple[int, bytes], tuple[list, _Vocab]] = {}


def _shared_vocab(vocab: list[bytes | None], ob: bytes) -> _Vocab:
    held = _VOCABS.get((id(vocab), ob))
    if held is None or held[0] is not vocab:
        held = (vocab, _Vocab(vocab, ob))  # holding the list keeps its id unique
        _VOCABS[(id(vocab), ob)] = held
    return held[1]


class BracketConstraint:
    """Per-sequence state machine for bracket-mode hybrid decoding (free text, index-valid text in ``[…]``)."""

    def __init__(self, docids: Iterable[str] | DocidBytes, vocab: list[bytes | None], open: str = "[", close: str = "]"):
        ob, cb = open.encode(), close.encode()
        # Single bytes keep the state exact across token boundaries (no half-seen bracket to remember).
        if len(ob) != 1 or len(cb) != 1 or ob == cb:
            raise ValueError(f"brackets must be two different single-byte characters, got {open!r} {close!r}")
        self.open, self.close = ob, cb
        if isinstance(docids, DocidBytes):
            # An index's docids, memory-mapped and sorted on disk (written without the bracket docids).
            self.docs: list[bytes] | DocidBytes = docids
            self._bisect = docids.bisect_left
            self._is_doc = docids.__contains__
        else:
            # A docid containing a bracket could never be written in this mode.
            docs = sorted({d.encode() for d in docids} - {b""})
            self.docs = [d for d in docs if ob not in d and cb not in d]
            self._bisect = functools.partial(bisect_left, self.docs)
            self._is_doc = frozenset(self.docs).__contains__
        self.vocab = vocab
        shared = _shared_vocab(vocab, ob)
        self._ids, self._toks, self.openers = shared.ids, shared.toks, shared.openers
        self._close_only = self._ids.get(cb, np.zeros(0, dtype=np.int64))
        # The free state is always the same, so its forbidden set is computed once.
        bad = np.array([i for i in self.openers if self._feed(None, vocab[i]) is _BAD], dtype=np.int64)
        self._free = Forbidden(bad) if len(bad) else None
        self._allowed_inside = functools.lru_cache(maxsize=65536)(self._compute_inside)

    @classmethod
    def from_index(cls, index_path: str | Path, tokenizer) -> "BracketConstraint":
        """The constraint over an index's docids, one per (path, tokenizer) and process: the docid texts are asked
        on disk (:mod:`grtool.index.docid_bytes`, written beside docids.parquet on first use if missing)."""
        tok = _unwrap(tokenizer)
        path = Path(index_path).resolve()
        key = (str(path), _fingerprint(tok))
        if key not in _OPEN:
            _OPEN[key] = cls(open_docid_bytes(path), vocab_of(tok))
        return _OPEN[key]

    # -------------------------------------------------------------------------- the state machine

    def initial(self, prompt_ids: list[int]):
        """The state after a prompt: free, or the docid text written since its last unclosed ``[``."""
        state = None
        for t in prompt_ids:
            state = self.advance(state, t)
        return state

    def advance(self, state, token: int):
        b = self.vocab[int(token)] if 0 <= int(token) < len(self.vocab) else None
        if b is None:
            return None  # a special token (eos, chat markers) ends any docid
        while b:
            if state is None:
                i = b.find(self.open)
                if i < 0:
                    return None
                state, b = b"", b[i + 1 :]
            else:
                i, j = b.find(self.close), b.find(self.open)
                if j >= 0 and (i < 0 or j < i):  # only forced: a new [ starts a new docid
                    state, b = b"", b[j + 1 :]
                elif i >= 0:
                    state, b = None, b[i + 1 :]
                else:
                    return state + b
        return state

    def is_free(self, state) -> bool:
        return state is None

    def allowed(self, state) -> np.ndarray | Forbidden | None:
        """Free: None or the Forbidden opener tokens; inside: the allowed ids (sorted, shared: do not modify)."""
        if state is None:
            return self._free
        return self._allowed_inside(state)

    # -------------------------------------------------------------------------- docid-side queries

    def _starts(self, q: bytes) -> bool:
        """Some docid starts with q."""
        i = self._bisect(q)
        return i < len(self.docs) and self.docs[i].startswith(q)

    def _feed(self, state, data: bytes):
        """The state after writing ``data`` if every docid it touches stays valid, else _BAD."""
        while data:
            if state is None:
                i = data.find(self.open)
                if i < 0:
                    return None
                state, data = b"", data[i + 1 :]
            else:
                i, j = data.find(self.close), data.find(self.open)
                if j >= 0 and (i < 0 or j < i):
                    return _BAD  # a bracket inside a docid
                if i >= 0:
                    if not self._is_doc(state + data[:i]):
                        return _BAD
                    state, data = None, data[i + 1 :]
                else:
                    q = state + data
                    return q if self._starts(q) else _BAD
        return state

    def _compute_inside(self, p: bytes) -> np.ndarray:
        lo = self._bisect(p)
        hi = self._bisect(p + b"\xff", lo)  # no UTF-8 byte is 0xff, so this bounds the docids starting with p
        found: list[np.ndarray] = []
        if lo < hi:
            self._walk(p, b"", lo, hi, found)
        if not found:
            # A prefix the index does not know (the prompt wrote it) can only be closed.
            return self._close_only
        return np.unique(np.concatenate(found))

    def _walk(self, p: bytes, x: bytes, lo: int, hi: int, found: list) -> None:
        """Collect tokens starting at x that continue p: docs[lo:hi] are exactly the docids starting with p+x,
        and x is a prefix of some token."""
        docs, toks = self.docs, self._toks
        q = p + x
        n = len(q)
        if x and x in self._ids:
            found.append(self._ids[x])
        i = lo
        if docs[i] == q:  # a complete docid: tokens x + "]" + rest, rest judged from free
            i += 1
            xc = x + self.close
            k = bisect_left(toks, xc)
            while k < len(toks) and toks[k].startswith(xc):
                if self._feed(None, toks[k][len(xc) :]) is not _BAD:
                    found.append(self._ids[toks[k]])
                k += 1
        # Each distinct next byte on the docid side, by bisect jumps; descend where a token also continues.
        while i < hi:
            b = docs[i][n]
            nxt = bytes([b])
            j = self._bisect(q + bytes([b + 1]), i, hi) if b < 255 else hi
            xn = x + nxt
            k = bisect_left(toks, xn)
            if k < len(toks) and toks[k].startswith(xn):
                self._walk(p, xn, i, j, found)
            i = j


_OPEN: dict[tuple[str, str], BracketConstraint] = {}
_VOCAB_BYTES: dict[str, list[bytes | None]] = {}


def vocab_of(tokenizer) -> list[bytes | None]:
    """:func:`token_bytes` of a tokenizer, once per tokenizer content (constraints share it and its trie)."""
    tok = _unwrap(tokenizer)
    key = _fingerprint(tok)
    if key not in _VOCAB_BYTES:
        _VOCAB_BYTES[key] = token_bytes(tok)
    return _VOCAB_BYTES[key]


_FINGERPRINTS: dict[int, tuple[object, str]] = {}


def _fingerprint(tok) -> str:
    """The tokenizer's content hash, remembered per object (serializing a 128K vocab is not free)."""
    held = _FINGERPRINTS.get(id(tok))
    if held is None or held[0] is not tok:
        held = (tok, hashlib.sha256(tok.to_str().encode()).hexdigest())  # holding tok keeps its id unique
        _FINGERPRINTS[id(tok)] = held
    return held[1]
