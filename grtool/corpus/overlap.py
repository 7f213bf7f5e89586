"""Over-specification: how many of a question's word n-grams appear verbatim in its gold documents.

Definition (DESIGN §1, issue 5). Text is lowercased with ``str.lower`` and then tokenized like NLTK's
``RegexpTokenizer(r"\\w+")``; a document's tokens are its title's tokens followed by its text's tokens. For a
question and a size n::

    overlap(n) = |set(question n-grams) ∩ ⋃ set(gold document n-grams)| / |set(question n-grams)|

A question with no n-gram of size n (fewer than n tokens) is left out of the mean for that n.

How it is made fast (the definition is checked against a plain NLTK computation in the tests):
- tokenizing: NLTK's regex engine spends most of the time of a naive run, so tokens are found by polars'
  Rust regex engine with a character class listing exactly the code points NLTK's ``\\w`` matches (asked of
  NLTK itself once per process), which makes both split any text identically;
- n-grams never exist as tuples: every token becomes a 64-bit hash and an n-gram the polynomial rolling hash
  of its tokens (mod 2**64), extended one token at a time with numpy;
- a document position can only start a matching n-gram of size ≥ n_min if its n_min-gram matches one of the
  question's, so the gold documents are scanned once at n_min and the larger sizes only look at those few
  candidate positions.
An n-gram is keyed by its question (15 bits) and 49 bits of its hash, so two n-grams can only be confused
within one question; with a few thousand (question n-gram, document n-gram) pairs per question the chance is
below 1e-10 per question and size.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from grtool.corpus.datasets import gold_incomplete_expr
from grtool.errors import InputError
from grtool.log import log
from grtool.store.reading import collect, scan_shards
from grtool.store.stage import read_table, shard_paths
from grtool.store.records import resolve_stage
from typing import Any
from grtool.records import Report

WORD_PATTERN = r"\w+"  # what NLTK's RegexpTokenizer is given; see word_regex() for the engine actually used
DEFAULT_NS = tuple(range(4, 13))
CHUNK_QUESTIONS = 16_384  # questions per vectorized chunk: bounds the temporary arrays to a few hundred MB
_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the rolling hash
_HASH_SEED = 0x5EED
_OWNER_BITS = 15  # question index inside a chunk
_MAX_OWNER = 1 << _OWNER_BITS
_HASH_BITS = np.uint64(64 - _OWNER_BITS)
_HASH_MASK = np.uint64((1 << _HASH_BITS) - 1)


# ------------------------------------------------------------------------------------------ tokens


@functools.cache
def word_regex() -> str:
    """A regex for polars (Rust engine) matching runs of exactly the characters NLTK's ``\\w`` matches.

    NLTK compiles tokenizer patterns with the ``regex`` module (older releases: ``re``), and the Unicode
    definitions of ``\\w`` differ between engines (combining marks, ``²``). So the class is not written by hand:
    NLTK's own tokenizer is asked once, over every code point, which characters are word characters.
    """
    from nltk.tokenize import RegexpTokenizer

    codepoints = [c for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    spaced = " ".join(map(chr, codepoints))  # each character alone: it is a token iff it is a word character
    words = sorted(ord(t) for t in RegexpTokenizer(WORD_PATTERN).tokenize(spaced))
    if " " in RegexpTokenizer(WORD_PATTERN).tokenize("a b") or not words:
        raise RuntimeError("unexpected NLTK tokenizer behaviour")
    ranges: list[list[int]] = []
    for cp in words:
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])

    def esc(cp: int) -> str:
        return f"\\x{{{cp:X}}}"

    return "[" + "".join(esc(a) if a == b else f"{esc(a)}-{esc(b)}" for a, b in ranges) + "]+"


def token_hashes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Lowercase and tokenize every text; return the 64-bit token hashes (concatenated) and tokens per text."""
    lowered = pl.Series("t", [t.lower() for t in texts], dtype=pl.String)
    tokens = lowered.str.extract_all(word_regex())
    lengths = tokens.list.len().fill_null(0).to_numpy().astype(np.int64)
    hashes = tokens.explode().drop_nulls().hash(_HASH_SEED).to_numpy()
    return hashes, lengths


def document_text(title: str | None, text: str | None) -> str:
    """Title then text; the newline keeps the two from running together into one token."""
    return f"{title or ''}\n{text or ''}"


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for every (s, c), without a Python loop."""
    counts = np.maximum(counts, 0)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    shifts = np.repeat(starts - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    return np.arange(total, dtype=np.int64) + shifts


# ------------------------------------------------------------------------------------------- core


def overlap_counts(
    questions: Sequence[str],
    gold: Sequence[Sequence[int]],
    docs: Sequence[str],
    ns: Sequence[int] = DEFAULT_NS,
) -> tuple[np.ndarray, np.ndarray]:
    """Per question and n: (distinct question n-grams found in its gold docs, distinct question n-grams).

    ``docs`` are document texts (see :func:`document_text`); ``gold[i]`` lists the indexes into ``docs`` of
    question i's gold documents. Both arrays have shape ``(len(questions), len(ns))``.
    """
    ns = sorted(set(ns))
    nq = len(questions)
    found = np.zeros((nq, len(ns)), np.int64)
    distinct = np.zeros((nq, len(ns)), np.int64)
    if nq == 0:
        return found, distinct
    n_min, n_max = ns[0], ns[-1]

    if nq > _MAX_OWNER:
        raise ValueError(f"at most {_MAX_OWNER} questions per call, got {nq}")

    hashes, lengths = token_hashes(list(questions) + list(docs))
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    total = int(offsets[-1])
    text_end = np.repeat(offsets[1:], lengths)  # per token: where its text ends
    padded = np.concatenate((hashes, np.zeros(n_max, np.uint64)))  # so position + k never runs off the end

    # n_min-gram hash at every position (meaningless where it crosses a text end; masked below).
    rolling = hashes.copy()
    for k in range(1, n_min):
        rolling = rolling * _BASE + padded[k : k + total]

    # Question positions.
    q_tokens = int(offsets[nq])
    q_pos = np.arange(q_tokens, dtype=np.int64)
    q_owner = np.repeat(np.arange(nq, dtype=np.uint64), lengths[:nq])
    q_hash = rolling[:q_tokens].copy()

    # Gold document positions that start an n_min-gram, one copy per (question, gold doc) pair.
    pair_q = np.fromiter((i for i, g in enumerate(gold) for _ in g), np.uint64)
    pair_d = np.fromiter((d for g in gold for d in g), np.int64) + nq
    starts = offsets[pair_d]
    n_starts = np.maximum(offsets[pair_d + 1] - n_min + 1 - starts, 0)
    d_pos = _ranges(starts, n_starts)
    d_owner = np.repeat(pair_q, n_starts)

    # Only document positions whose n_min-gram is one of its question's can start a longer match.
    q_ok = q_pos + n_min <= text_end[q_pos]
    candidate = _is_in(_keys(q_owner[q_ok], q_hash[q_ok]), _keys(d_owner, rolling[d_pos]))
    c_pos, c_owner = d_pos[candidate], d_owner[candidate]
    c_hash = rolling[c_pos]
    del rolling, d_pos, d_owner

    for n in range(n_min, n_max + 1):
        if n > n_min:
            q_hash = q_hash * _BASE + padded[q_pos + n - 1]
            c_hash = c_hash * _BASE + padded[c_pos + n - 1]
        if n not in ns:
            continue
        k = ns.index(n)
        q_ok = q_pos + n <= text_end[q_pos]
        keys = np.sort(_keys(q_owner[q_ok], q_hash[q_ok]))
        if len(keys):
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]  # distinct n-grams per question
        owner = (keys >> _HASH_BITS).astype(np.int64)
        c_ok = c_pos + n <= text_end[c_pos]
        hit = _is_in(_keys(c_owner[c_ok], c_hash[c_ok]), keys)
        distinct[:, k] = np.bincount(owner, minlength=nq)
        found[:, k] = np.bincount(owner[hit], minlength=nq)
    return found, distinct


def _keys(owner: np.ndarray, gram_hash: np.ndarray) -> np.ndarray:
    """One 64-bit key per (question, n-gram): the question in the top bits, so questions never collide."""
    return (owner << _HASH_BITS) | (gram_hash & _HASH_MASK)


def _is_in(members: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each of ``values``: is it among ``members``."""
    if len(values) == 0 or len(members) == 0:
        return np.zeros(len(values), bool)
    # A hash set (polars) instead of np.isin's sort: the document side is the big one.
    return pl.Series(values).is_in(pl.Series(members).implode()).to_numpy()


# --------------------------------------------------------------------------------------- datasets


@dataclass
class OverlapReport:
    ns: list[int]
    mean: dict[str, dict[int, float | None]] = field(default_factory=dict)  # dataset -> n -> mean overlap
    share_any: dict[str, dict[int, float | None]] = field(default_factory=dict)  # share of questions with ≥1 shared n-gram
    counted: dict[str, dict[int, int]] = field(default_factory=dict)  # questions that have n-grams of size n
    questions: dict[str, int] = field(default_factory=dict)  # questions measured per dataset
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> questions not measured

    def to_json(self) -> dict:
        """``per_dataset`` holds, per dataset, only that dataset's numbers (``mean`` overlap and
        ``share_with_overlap`` by n, ``questions_with_ngrams`` by n, ``questions``); what is about the whole
        run (the n sizes, questions left out, the tokenizer) has keys of its own."""
        per_dataset = {
            ds: {
                "questions": self.questions.get(ds, 0),
                "mean": {str(n): self.mean[ds][n] for n in self.ns},
                "share_with_overlap": {str(n): v for n, v in self.share_any.get(ds, {}).items()},
                "questions_with_ngrams": {str(n): v for n, v in self.counted.get(ds, {}).items()},
            }
            for ds in sorted(self.mean)
        }
        return {
            "ns": list(self.ns),
            "per_dataset": per_dataset,
            "left_out": dict(sorted(self.left_out.items())),
            "tokenizer": "NLTK RegexpTokenizer(r'\\w+') on lowercased text; document = title tokens + text tokens",
        }


class _Accumulator:
    def __init__(self, ns: list[int]):
        self.ns = ns
        self.sum: dict[str, np.ndarray] = {}
        self.any: dict[str, np.ndarray] = {}
        self.count: dict[str, np.ndarray] = {}
        self.questions: Counter[str] = Counter()

    def add(self, datasets: Sequence[str], found: np.ndarray, distinct: np.ndarray) -> None:
        has = distinct > 0
        ratio = np.divide(found, distinct, out=np.zeros(found.shape, np.float64), where=has)
        ds_arr = np.asarray(datasets, dtype=object)
        for ds in set(datasets):
            rows = ds_arr == ds
            z = np.zeros(len(self.ns))
            self.sum[ds] = self.sum.get(ds, z) + ratio[rows].sum(axis=0)
            self.any[ds] = self.any.get(ds, z) + (found[rows] > 0).sum(axis=0)
            self.count[ds] = self.count.get(ds, z) + has[rows].sum(axis=0)
            self.questions[ds] += int(rows.sum())

    def report(self, left_out: Counter[str]) -> OverlapReport:
        rep = OverlapReport(ns=list(self.ns), left_out=dict(left_out))
        for ds in sorted(self.sum):
            c = self.count[ds]
            rep.mean[ds] = {n: (float(self.sum[ds][k] / c[k]) if c[k] else None) for k, n in enumerate(self.ns)}
            rep.share_any[ds] = {n: (float(self.any[ds][k] / c[k]) if c[k] else None) for k, n in enumerate(self.ns)}
            rep.counted[ds] = {n: int(c[k]) for k, n in enumerate(self.ns)}
            rep.questions[ds] = self.questions[ds]
        return rep


def overlap_of_rows(rows: Sequence[tuple[str, str, Sequence[int]]], docs: Sequence[str], ns: Sequence[int] = DEFAULT_NS, chunk: int = CHUNK_QUESTIONS) -> OverlapReport:
    """In-memory entry point: ``rows`` are (dataset, question, gold doc indexes into ``docs``)."""
    acc = _Accumulator(sorted(set(ns)))
    for lo in range(0, len(rows), chunk):
        part = rows[lo : lo + chunk]
        used = sorted({d for _, _, g in part for d in g})
        local = {d: i for i, d in enumerate(used)}
        found, distinct = overlap_counts([q for _, q, _ in part], [[local[d] for d in g] for _, _, g in part], [docs[d] for d in used], ns)
        acc.add([ds for ds, _, _ in part], found, distinct)
    return acc.report(Counter())


def corpus_overlap(corpus: str | Path, ns: Sequence[int] = DEFAULT_NS, chunk: int = CHUNK_QUESTIONS) -> OverlapReport:
    """The overlap report of an ingested corpus (a run directory holding ``questions/`` and ``documents/``).

    Memory holds the questions and the text of their gold documents only, never the whole corpus.
    Questions without gold documents, or whose gold documents are missing from ``documents/``, are left out
    and counted in ``left_out``.
    """
    ns = sorted(set(ns))
    if not ns or ns[0] < 1:
        raise InputError(f"n-gram sizes must be positive integers, got {ns}")
    q_stage = resolve_stage(corpus, "questions")
    d_stage = resolve_stage(corpus, "documents")
    questions = read_table(q_stage, ["qid", "dataset", "question", "gold_doc_ids", "meta"])
    if questions.num_rows == 0:
        raise InputError(f"{q_stage}: no questions")
    q = pl.from_arrow(questions).with_row_index("qi")
    left_out: Counter[str] = Counter()

    pairs = q.select("qi", "gold_doc_ids").explode("gold_doc_ids").drop_nulls("gold_doc_ids").rename({"gold_doc_ids": "doc_id"})
    gold_ids = pairs.get_column("doc_id").unique()
    docs = _load_gold_documents(d_stage, gold_ids)
    pairs = pairs.join(docs.select("doc_id", "di"), on="doc_id", how="left")
    missing = pairs.filter(pl.col("di").is_null()).get_column("qi").unique()
    no_gold = q.filter(pl.col("gold_doc_ids").list.len().fill_null(0) == 0).get_column("qi")
    if len(missing):
        left_out["gold_document_missing"] = len(missing)
        log.warning("%d questions name gold documents that %s does not hold; left out", len(missing), d_stage)
    if len(no_gold):
        left_out["no_gold_documents"] = len(no_gold)
    # A gold title absent from the fullwiki context (and not resolved from a dump): the overlap would be too low.
    incomplete = q.filter(gold_incomplete_expr()).get_column("qi")
    incomplete = incomplete.filter(~incomplete.is_in(no_gold.implode()) & ~incomplete.is_in(missing.implode()))
    if len(incomplete):
        left_out["gold_incomplete"] = len(incomplete)
    dropped = pl.concat([missing, no_gold, incomplete])
    keep = q.filter(~pl.col("qi").is_in(dropped.implode()))
    gold_by_q = pairs.filter(pl.col("qi").is_in(keep.get_column("qi").implode())).group_by("qi", maintain_order=True).agg(pl.col("di"))
    keep = keep.join(gold_by_q, on="qi", how="inner").sort("qi")

    texts = docs.get_column("text").to_list()
    acc = _Accumulator(ns)
    for lo in range(0, keep.height, chunk):
        part = keep.slice(lo, chunk)
        gold = part.get_column("di").to_list()
        used = sorted({d for g in gold for d in g})
        local = {d: i for i, d in enumerate(used)}
        found, distinct = overlap_counts(part.get_column("question").fill_null("").to_list(), [[local[d] for d in g] for g in gold], [texts[d] for d in used], ns)
        acc.add(part.get_column("dataset").fill_null("unknown").to_list(), found, distinct)
    return acc.report(left_out)


def _load_gold_documents(stage: Path, gold_ids: pl.Series) -> pl.DataFrame:
    """doc_id, di (row number) and the title+text of the gold documents, streamed out of the documents stage."""
    shards = shard_paths(stage)
    if not shards:
        return pl.DataFrame({"doc_id": [], "text": [], "di": []}, schema={"doc_id": pl.String, "text": pl.String, "di": pl.UInt32})
    docs = collect(
        scan_shards(shards).select("doc_id", "title", "text").filter(pl.col("doc_id").is_in(gold_ids.implode())).unique("doc_id", keep="first", maintain_order=True),
        shards,
    )
    docs = docs.with_columns(text=pl.concat_str([pl.col("title").fill_null(""), pl.lit("\n"), pl.col("text").fill_null("")])).select("doc_id", "text")
    return docs.with_row_index("di")


# -------------------------------------------------------------------------------------- rendering


MAX_NGRAM = 1000  # n-grams longer than any paragraph's words


def parse_ns(spec: str) -> list[int]:
    """``4-12``, ``4,6,8`` or ``5`` → sizes."""
    from grtool.userinput import parse_number, shown

    def size(text: str) -> int:
        return parse_number(text, integer=True, low=1, high=MAX_NGRAM)

    sizes: set[int] = set()
    try:
        for part in spec.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = size(a), size(b)
                if lo > hi:
                    raise ValueError
                sizes.update(range(lo, hi + 1))
            elif part:
                sizes.add(size(part))
    except ValueError:
        raise InputError(f"--n {shown(spec)}: expected sizes from 1 to {MAX_NGRAM} like 4-12, 4,6,8 or 5") from None
    if not sizes:
        raise InputError(f"--n {shown(spec)}: expected sizes from 1 to {MAX_NGRAM} like 4-12, 4,6,8 or 5")
    return sorted(sizes)


def plot_overlap(report: OverlapReport, path: str | Path) -> Path:
    """A PNG line chart: mean overlap (%) against n, one line per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for ds in sorted(report.mean):
        xs = [n for n in report.ns if report.mean[ds][n] is not None]
        ys = [100 * report.mean[ds][n] for n in xs]
        ax.plot(xs, ys, marker="o", linewidth=2, label=f"{ds} ({report.questions[ds]} q)")
    ax.set_xlabel("n-gram size n")
    ax.set_ylabel("mean overlap with gold documents (%)")
    ax.set_title("Over-specification: question n-grams found in gold documents")
    ax.set_xticks(report.ns)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)  # the path its caller's claim gives (grtool.store.partloop.claim_file)
    plt.close(fig)
    return Path(path)


def iter_table_rows(report: OverlapReport) -> Iterator[tuple[str, list[str]]]:
    """Rows for a terminal table: dataset, then mean overlap per n as percentages."""
    for ds in sorted(report.mean):
        yield ds, ["–" if report.mean[ds][n] is None else f"{100 * report.mean[ds][n]:.1f}" for n in report.ns]


class OverlapSummary(Report, kw_only=True):
    """``corpus overlap --json``: :meth:`Overlap.to_json`."""

    ns: list[int]
    per_dataset: dict[str, dict[str, Any]]
    left_out: dict[str, Any]
    tokenizer: str
