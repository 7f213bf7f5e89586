"""The docid constraint a request names (``Sampling.constraint``), built once per process and shared.

A spec is a small JSON-able dict, so it can travel in the request cache key and in vLLM's per-request
``extra_args``::

    {"index": "/abs/path/index", "fingerprint": "…", "markers": "special" | "brackets", "max_docids": 3 | None}

- ``special``: the token-level :class:`~grtool.index.decoding.DocidConstraint` over the index (the model writes the
  two marker tokens; its tokenizer agrees with the index's, see :mod:`grtool.index.agreement`);
- ``brackets``: the text-level :class:`~grtool.index.text_constraint.BracketConstraint` over the index's docid
  strings and the model's vocabulary (``[`` opens, ``]`` closes, whatever the tokens around them look like).

``max_docids`` wraps either in :class:`DocidLimit`, which forbids opening a docid after that many were closed.

- ``{"markers": "brackets", "source": "prompt", "triples": [[head, relation, tail], ...]}`` (`chains synthesize
  --constrain`): :class:`OfferedTriples`, a bracket constraint per row over the triples its own prompt lists, as
  listed and tail-first; the tail-first spelling is rendered from the parts in ``triples`` (the batch's offered
  triples; a backend may pass each request only its own, :func:`offered_triples`), never split from the text.
- ``documents`` (`retrieve --mode gmr`): :class:`DocumentConstraint` over an index of ``--source documents``: the
  whole output is one document sequence or ``DONE``, then EOS (the backend passes its EOS ids).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from grtool.docid import BRACKETS, Triple, flip, render
from grtool.errors import InputError
from grtool.index.decoding import Forbidden
from grtool.vocab.gmr import DONE

_BUILT: dict[tuple, Any] = {}


def constraint_from_spec(spec: dict[str, Any], tokenizer=None, eos_ids=None) -> Any:
    """The constraint object for a spec; ``tokenizer`` (the model's ``tokenizers.Tokenizer``) for brackets,
    ``eos_ids`` (the token ids generation stops at) for documents."""
    markers = spec.get("markers", "special")
    if spec.get("source") == "prompt":
        if markers != "brackets" or tokenizer is None:
            raise InputError("a constraint to the prompt's triples needs bracket markers and the model's tokenizer")
        from grtool.index.text_constraint import vocab_of

        return OfferedTriples.for_vocab(vocab_of(tokenizer)).offering(spec.get("triples") or ())
    vocab_key = id(tokenizer) if markers == "brackets" else None  # a backend keeps its tokenizer for its lifetime
    eos_key = tuple(sorted(int(t) for t in eos_ids or ())) if markers == "documents" else None
    key = (spec["index"], spec.get("fingerprint"), markers, spec.get("max_docids"), vocab_key, eos_key)
    if key not in _BUILT:
        if markers == "documents":
            if not eos_key:
                raise InputError("a document constraint needs the model's end-of-sequence token ids")
            from grtool.index.base import Index

            _BUILT[key] = DocumentConstraint(Index.open(spec["index"]), eos_key)  # max_docids means nothing here
            return _BUILT[key]
        if markers == "special":
            from grtool.index.decoding import constraint_for

            inner = constraint_for(spec["index"])
        elif markers == "brackets":
            if tokenizer is None:
                raise InputError("a bracket docid constraint needs the model's tokenizer")
            from grtool.index.text_constraint import BracketConstraint

            inner = BracketConstraint.from_index(spec["index"], tokenizer)
        else:
            raise InputError(f"unknown docid markers {markers!r} (special, brackets or documents)")
        limit = spec.get("max_docids")
        _BUILT[key] = DocidLimit(inner, int(limit)) if limit else inner
    return _BUILT[key]


class DocidLimit:
    """A constraint that, after ``limit`` complete docids, forbids the tokens that would open another one."""

    def __init__(self, inner: Any, limit: int):
        self.inner = inner
        self.limit = limit

    def initial(self, prompt_ids: list[int]) -> tuple[Any, int]:
        return self.inner.initial(prompt_ids), 0

    def advance(self, state: tuple[Any, int], token: int) -> tuple[Any, int]:
        inner, closed = state
        after = self.inner.advance(inner, token)
        if not self.inner.is_free(inner) and self.inner.is_free(after):
            closed += 1
        return after, closed

    def is_free(self, state: tuple[Any, int]) -> bool:
        return self.inner.is_free(state[0])

    def allowed(self, state: tuple[Any, int]):
        inner, closed = state
        allowed = self.inner.allowed(inner)
        if closed < self.limit or not self.inner.is_free(inner):
            return allowed
        openers = np.asarray(self.inner.openers, dtype=np.int64)
        if isinstance(allowed, Forbidden):
            return Forbidden(np.union1d(allowed.ids, openers))
        if allowed is None:
            return Forbidden(openers)
        return np.setdiff1d(allowed, openers)

    @property
    def openers(self) -> np.ndarray:
        return self.inner.openers


class DocumentConstraint:
    """The whole output is one sequence of a ``--source documents`` index, or ``DONE``; then only EOS.

    A state is ``(index state | None, DONE tokens matched | -1, ended)``, anchored at a sequence start from the
    first generated token whatever the prompt holds. A prefix that is both a whole document and the start of a
    longer one may end or go on.
    """

    def __init__(self, index: Any, eos_ids: tuple[int, ...]):
        if index.source != "documents":
            raise InputError(f"{index.path}: an index of {index.source}; document decoding needs --source documents")
        self.index = index
        self.eos = np.array(sorted(set(eos_ids)), dtype=np.int64)
        self._eos_set = {int(t) for t in eos_ids}
        self.done_ids = list(index.tokenizer.encode(DONE))
        self.openers = np.zeros(0, dtype=np.int64)  # nothing opens a span: the whole output is one

    @staticmethod
    def is_free(state: Any) -> bool:
        return False

    def initial(self, prompt_ids: list[int]) -> tuple[Any, int, bool]:
        return self.index.start(), 0, False

    def advance(self, state: tuple[Any, int, bool], token: int) -> tuple[Any, int, bool]:
        doc, done, ended = state
        token = int(token)
        if ended or token in self._eos_set:
            return None, -1, True
        if doc is not None:
            doc = self.index.extend(doc, token)
            if self.index.count(doc) == 0:
                doc = None
        if 0 <= done < len(self.done_ids) and self.done_ids[done] == token:
            done += 1
        else:
            done = -1
        return doc, done, False

    def allowed(self, state: tuple[Any, int, bool]) -> np.ndarray:
        doc, done, ended = state
        if ended:
            return self.eos  # a finished row: its scores are not used
        parts = []
        if doc is not None:
            ids, counts = self.index.next_tokens(doc)
            parts.append(np.asarray(ids, dtype=np.int64))
            if self.index.count(doc) > int(np.sum(counts)):  # an occurrence not followed by a token ends its sequence
                parts.append(self.eos)
        if 0 <= done < len(self.done_ids):
            parts.append(np.array([self.done_ids[done]], dtype=np.int64))
        elif done == len(self.done_ids):
            parts.append(self.eos)
        if not parts or not sum(len(p) for p in parts):
            return self.eos  # cannot happen under the constraint; end rather than mask every token
        return np.unique(np.concatenate(parts))


TRIPLES_HEADING = "Triples:"  # the chains prompt lists the offered triples under it, one "N. [head, relation, tail]" a line
_LISTED = re.compile(r"^\d+\. \[(.+)\]$")


def listed_docids(prompt_text: str) -> list[str]:
    """The docid texts (between the brackets) the prompt's last ``Triples:`` list shows, as written."""
    at = prompt_text.rfind(f"\n{TRIPLES_HEADING}\n")
    if at < 0:
        return []
    listed: list[str] = []
    for line in prompt_text[at + len(TRIPLES_HEADING) + 2 :].split("\n"):
        m = _LISTED.match(line.strip())
        if m is None:
            if listed:
                break
            continue
        listed.append(m.group(1))
    return listed


def _inner(triple: Triple) -> str:
    """A triple's docid text between square brackets, as the chains prompt lists it (rendered from its parts)."""
    return BRACKETS.unwrap(render(triple, BRACKETS)) or ""


def offered_triples(prompt_text: str, triples: Iterable[Sequence[str]] | dict[str, list[Triple]]) -> list[Triple]:
    """Those of ``triples`` (``[head, relation, tail]``, the spec's ``triples``, or :func:`by_listed` of them, built
    once for many prompts) whose docid text the prompt lists, in the prompt's order."""
    by_text = triples if isinstance(triples, dict) else by_listed(triples)
    return [t for inner in dict.fromkeys(listed_docids(prompt_text)) for t in by_text.get(inner, ())]


def by_listed(triples: Iterable[Sequence[str]]) -> dict[str, list[Triple]]:
    """The triples by their docid text as the prompt lists it."""
    by_text: dict[str, list[Triple]] = {}
    for t in map(_as_triple, triples):
        by_text.setdefault(_inner(t), []).append(t)
    return by_text


def _as_triple(parts: Sequence[str]) -> Triple:
    head, relation, tail = parts
    return str(head), str(relation), str(tail)


def offered_docids(prompt_text: str, triples: Iterable[Sequence[str]] = ()) -> list[str]:
    """The docid texts the prompt's last ``Triples:`` list offers: each listed text as written, and the tail-first
    spelling of every triple of ``triples`` (the stored parts the prompt was built from) it lists. A text is never
    split back into parts (a head may hold a comma: ``Paris, Texas``), so a listed text without its triple is
    offered forward only."""
    return _offered(listed_docids(prompt_text), tail_first(triples))


def tail_first(triples: Iterable[Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """Each triple's docid text as the prompt lists it → its tail-first text(s), rendered from the parts."""
    flips: dict[str, tuple[str, ...]] = {}
    for t in map(_as_triple, triples):
        flips[_inner(t)] = (*flips.get(_inner(t), ()), _inner(flip(t)))
    return flips


def _offered(listed: list[str], flips: dict[str, tuple[str, ...]]) -> list[str]:
    return list(dict.fromkeys(d for inner in listed for d in (inner, *flips.get(inner, ()))))


_REGEX_SPECIAL = re.compile(r"([\\.^$*+?()\[\]{}|/-])")


def offered_regex(prompt_text: str, triples: Iterable[Sequence[str]] = ()) -> str:
    """The same rule as :class:`OfferedTriples` as one regular expression over the whole output, for servers that
    take structured output (vLLM's ``structured_outputs.regex``): free text without ``[``, and ``[`` only opening
    one of the offered docids, closed by ``]``. Only plain groups and backslash escapes, which every regex backend
    of vLLM (xgrammar, guidance, outlines) reads."""
    docids = sorted(set(offered_docids(prompt_text, triples)))
    spans = "|".join(_REGEX_SPECIAL.sub(r"\\\1", d) for d in docids)
    return f"([^\\[]|\\[({spans})\\])*" if docids else "[^\\[]*"


class OfferedTriples:
    """Per row, a :class:`~grtool.index.text_constraint.BracketConstraint` over the triples its prompt offers.

    The prompt is read once per row (``initial``); rows offering the same triples share one constraint. The
    state is ``(constraint, inner state)``, starting free (the listed triples' brackets are the prompt's, not a
    docid being written).
    """

    _BY_VOCAB: dict[int, tuple[list, "OfferedTriples"]] = {}

    def __init__(self, vocab: list[bytes | None]):
        from grtool.index.text_constraint import BracketConstraint

        self.vocab = vocab
        self._build = functools.lru_cache(maxsize=4096)(lambda docids: BracketConstraint(docids, vocab))
        self.openers = self._build(()).openers

    @classmethod
    def for_vocab(cls, vocab: list[bytes | None]) -> "OfferedTriples":
        held = cls._BY_VOCAB.get(id(vocab))
        if held is None or held[0] is not vocab:
            held = (vocab, cls(vocab))
            cls._BY_VOCAB[id(vocab)] = held
        return held[1]

    def offering(self, triples: Iterable[Sequence[str]]) -> "_Offering":
        """This constraint with the parts of the triples the prompts were built from (the spec's ``triples``)."""
        return _Offering(self, tail_first(triples))

    def initial(self, prompt_ids: list[int], flips: dict[str, tuple[str, ...]] | None = None) -> tuple[Any, Any]:
        """``flips``: :func:`tail_first` of the triples the prompts were built from (none: listed spellings only)."""
        text = b"".join(self.vocab[t] or b"" for t in prompt_ids if 0 <= t < len(self.vocab)).decode("utf-8", "replace")
        return self._build(tuple(sorted(set(_offered(listed_docids(text), flips or {}))))), None

    def advance(self, state: tuple[Any, Any], token: int) -> tuple[Any, Any]:
        constraint, inner = state
        return constraint, constraint.advance(inner, token)

    def is_free(self, state: tuple[Any, Any]) -> bool:
        return state[1] is None

    def allowed(self, state: tuple[Any, Any]):
        constraint, inner = state
        return constraint.allowed(inner)


class _Offering:
    """:class:`OfferedTriples` (shared per vocabulary, with its built constraints) with one spec's triples."""

    def __init__(self, shared: OfferedTriples, flips: dict[str, tuple[str, ...]]):
        self.shared = shared
        self.flips = flips  # built once per spec, read per row
        self.openers = shared.openers

    def initial(self, prompt_ids: list[int]) -> tuple[Any, Any]:
        return self.shared.initial(prompt_ids, self.flips)

    def advance(self, state: tuple[Any, Any], token: int) -> tuple[Any, Any]:
        return self.shared.advance(state, token)

    def is_free(self, state: tuple[Any, Any]) -> bool:
        return self.shared.is_free(state)

    def allowed(self, state: tuple[Any, Any]):
        return self.shared.allowed(state)
