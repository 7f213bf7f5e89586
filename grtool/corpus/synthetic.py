"""Synthetic inputs in the release layouts, for benchmarks and the resume tests.

- :func:`write_wiki_dump`: a tree ``AA/wiki_00.bz2 …`` of JSON Lines, one article per line with ``id``,
  ``url``, ``title``, ``text`` (sentences, later ones with their leading space), ``charoffset``,
  ``text_with_links`` and ``charoffset_with_links``: the HotpotQA Wikipedia abstracts layout.
- :func:`write_hotpot_array`: one JSON array in the HotpotQA train layout (10 context paragraphs per
  question, two of them gold), whose paragraphs are drawn from a shared pool so that they repeat across
  questions the way real ones do.

Texts are pseudo-words from a seeded generator: the same arguments give the same bytes.
"""

from __future__ import annotations

import bz2
import random
from pathlib import Path

import orjson

_SYLLABLES = ["ka", "lo", "mi", "ren", "tus", "va", "dor", "el", "shi", "an", "po", "rit", "ne", "gal", "ur", "bes"]


def _sentence_pool(rng: random.Random, n: int) -> list[str]:
    words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(4000)]
    pool = []
    for _ in range(n):
        ws = [rng.choice(words) for _ in range(rng.randint(6, 22))]
        pool.append(" ".join(ws).capitalize() + ".")
    return pool


def _paragraph(rng: random.Random, pool: list[str], lo: int = 1, hi: int = 5) -> list[str]:
    first, *rest = rng.sample(pool, rng.randint(lo, hi))
    return [first] + [" " + s for s in rest]


def _offsets(sentences: list[str]) -> list[list[list[int]]]:
    out, base = [], 0
    for s in sentences:
        spans, pos = [], base
        for w in s.split(" "):
            if w:
                spans.append([pos, pos + len(w)])
            pos += len(w) + 1
        out.append(spans)
        base += len(s)
    return out


def write_wiki_dump(root: Path, n_docs: int, *, docs_per_file: int = 10_000, compress: bool = True, seed: int = 0) -> list[Path]:
    """Write ``n_docs`` articles under ``root``; returns the files written."""
    rng = random.Random(seed)
    pool = _sentence_pool(rng, 20_000)
    files = []
    n_files = max(1, -(-n_docs // docs_per_file))
    for f in range(n_files):
        sub = f"A{chr(ord('A') + f // 100)}" if f // 100 < 26 else f"B{f // 100 - 26:02d}"
        path = root / sub / (f"wiki_{f % 100:02d}" + (".bz2" if compress else ""))
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(f * docs_per_file, min(n_docs, (f + 1) * docs_per_file)):
            text = _paragraph(rng, pool)
            offsets = _offsets(text)
            lines.append(
                orjson.dumps(
                    {
                        "id": str(i + 12),
                        "url": f"https://en.wikipedia.org/wiki?curid={i + 12}",
                        "title": f"Synthetic article {i}",
                        "text": text,
                        "charoffset": offsets,
                        "text_with_links": text,
                        "charoffset_with_links": offsets,
                    }
                )
            )
        data = b"\n".join(lines) + b"\n"
        path.write_bytes(bz2.compress(data, 9) if compress else data)
        files.append(path)
    return files


def write_hotpot_array(path: Path, n_questions: int, *, pool_paragraphs: int | None = None, seed: int = 1) -> Path:
    """Write a HotpotQA-train-like JSON array of ``n_questions`` records, streamed to disk."""
    rng = random.Random(seed)
    sentences = _sentence_pool(rng, 20_000)
    n_pool = pool_paragraphs or max(10, 2 * n_questions)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as out:
        out.write(b"[")
        for q in range(n_questions):
            picks = rng.sample(range(n_pool), 10)
            context = []
            for p in picks:
                prng = random.Random(seed * 1_000_003 + p)  # a pool paragraph is the same wherever it appears
                context.append([f"Synthetic paragraph {p}", _paragraph(prng, sentences, 2, 4)])
            gold = [context[0][0], context[3][0]]
            record = {
                "supporting_facts": [[gold[0], 0], [gold[1], 1]],
                "level": rng.choice(["easy", "medium", "hard"]),
                "question": f"Synthetic question {q} about {gold[0]} and {gold[1]}?",
                "context": context,
                "answer": "yes",
                "_id": f"{q:024x}",
                "type": rng.choice(["bridge", "comparison"]),
            }
            if q:
                out.write(b", ")
            out.write(orjson.dumps(record))
        out.write(b"]")
    return path
