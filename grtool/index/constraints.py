"""The docid constraint a request names (``Sampling.constraint``), built once per process and shared.

A spec is a small JSON-able dict, so it can travel in the request cache key and in vLLM's per-request
``extra_args``::

    {"index": "/abs/path/index", "fingerprint": "…", "markers": "special" | "brackets", "max_docids": 3 | None}

- ``special``: the token-level :class:`~grtool.index.decoding.DocidConstraint` over the index (the model writes the
  two marker tokens; its tokenizer agrees with the index's, see :mod:`grtool.index.agreement`);
- ``brackets``: the text-level :class:`~grtool.index.text_constraint.BracketConstraint` over the index's docid
  strings and the model's vocabulary (``[`` opens, ``]`` closes, whatever the tokens around them look like).

``max_docids`` wraps either in :class:`DocidLimit`, which forbids opening a docid after that many were closed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from grtool.errors import InputError
from grtool.index.decoding import Forbidden

_BUILT: dict[tuple, Any] = {}


def constraint_from_spec(spec: dict[str, Any], tokenizer=None) -> Any:
    """The constraint object for a spec; ``tokenizer`` (the model's ``tokenizers.Tokenizer``) for brackets."""
    markers = spec.get("markers", "special")
    vocab_key = id(tokenizer) if markers == "brackets" else None  # a backend keeps its tokenizer for its lifetime
    key = (spec["index"], spec.get("fingerprint"), markers, spec.get("max_docids"), vocab_key)
    if key not in _BUILT:
        if markers == "special":
            from grtool.index.decoding import constraint_for

            inner = constraint_for(spec["index"])
        elif markers == "brackets":
            if tokenizer is None:
                raise InputError("a bracket docid constraint needs the model's tokenizer")
            from grtool.index.text_constraint import BracketConstraint

            inner = BracketConstraint.from_index(spec["index"], tokenizer)
        else:
            raise InputError(f"unknown docid markers {markers!r} (special or brackets)")
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
