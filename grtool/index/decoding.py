"""Hybrid constrained decoding: free text until <docid_start>, then only index-valid tokens until <docid_end>.

:class:`DocidConstraint` is the per-sequence state machine both adapters share. Each sequence keeps its
index state between steps and advances it by the one new token (the prefix is never re-walked):

- transformers: :class:`DocidLogitsProcessor` (a ``transformers.LogitsProcessor``);
- vLLM v1: ``grtool.index.vllm_processor.DocidVllmLogitsProcessor`` (per-request index via
  ``SamplingParams.extra_args={"docid_index": PATH}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grtool.index.base import Index

_FREE = None  # the sequence state outside a docid


@dataclass(frozen=True)
class Forbidden:
    """Token ids that may not come next (everything else may)."""

    ids: np.ndarray


@dataclass
class DocidConstraint:
    index: Index

    def __post_init__(self):
        self.start_id = self.index.start_id
        self.end_id = self.index.end_id
        self._end_only = np.array([self.end_id], dtype=np.int64)
        self.openers = np.array([self.start_id], dtype=np.int64)  # the tokens that open a docid

    @staticmethod
    def is_free(state: Any) -> bool:
        return state is _FREE

    def initial(self, prompt_ids: list[int]) -> Any:
        """The state after a prompt: free, or (when the prompt ends inside a docid) the walked docid prefix."""
        ids = list(prompt_ids)
        last_start = max((i for i, t in enumerate(ids) if t == self.start_id), default=-1)
        if last_start < 0 or self.end_id in ids[last_start:]:
            return _FREE
        state = self.index.extend(self.index.start(), self.start_id)
        for t in ids[last_start + 1 :]:
            state = self.index.extend(state, t)
        return state

    def advance(self, state: Any, token: int) -> Any:
        token = int(token)
        if state is _FREE:
            return self.index.extend(self.index.start(), token) if token == self.start_id else _FREE
        if token == self.end_id:
            return _FREE
        return self.index.extend(state, token)

    def allowed(self, state: Any) -> np.ndarray | None:
        """Token ids allowed next; None = unconstrained."""
        if state is _FREE:
            return None
        ids, _counts = self.index.next_tokens(state)
        # A prefix the index does not know (the prompt wrote it) can only be closed.
        return ids.astype(np.int64) if len(ids) else self._end_only


_OPEN: dict[str, DocidConstraint] = {}


def constraint_for(path: str | Path) -> DocidConstraint:
    """One open index per path and process (opening maps the files, so it is cheap to share)."""
    key = str(Path(path).resolve())
    if key not in _OPEN:
        _OPEN[key] = DocidConstraint(Index.open(key))
    return _OPEN[key]


def mask_row(scores_row, allowed: np.ndarray | Forbidden) -> None:
    """Set every score outside ``allowed`` (or, for a :class:`Forbidden`, inside its ids) to -inf, in place (torch row)."""
    import torch

    if isinstance(allowed, Forbidden):
        ban = allowed.ids[allowed.ids < scores_row.shape[-1]]
        if len(ban):
            scores_row.index_fill_(0, torch.as_tensor(ban, device=scores_row.device), float("-inf"))
        return
    keep = torch.as_tensor(allowed[allowed < scores_row.shape[-1]], device=scores_row.device)
    kept = scores_row.index_select(0, keep)
    scores_row.fill_(float("-inf"))
    scores_row.index_copy_(0, keep, kept)


def docids_in(ids: list[int], start_id: int, end_id: int) -> list[list[int]]:
    """Every complete ``<docid_start> … <docid_end>`` span in a token sequence, markers included."""
    spans, begin = [], None
    for i, t in enumerate(ids):
        if t == start_id:
            begin = i
        elif t == end_id and begin is not None:
            spans.append(list(ids[begin : i + 1]))
            begin = None
    return spans


def _transformers_base():
    from transformers import LogitsProcessor

    return LogitsProcessor


class DocidLogitsProcessor(_transformers_base()):
    """transformers ``LogitsProcessor`` for hybrid docid decoding (greedy, sampling and beam search).

    ``constraint``: an index (or its directory: special markers), or any constraint object with ``initial``,
    ``advance`` and ``allowed`` (:mod:`grtool.index.constraints`). Rows are matched to the previous step by their
    generated tokens, so beam reordering keeps the right state; each row's state advances by one token per step.
    """

    def __init__(self, constraint: Any):
        if isinstance(constraint, Index):
            constraint = DocidConstraint(constraint)
        elif isinstance(constraint, (str, Path)):
            constraint = constraint_for(constraint)
        self.constraint = constraint
        self._prompt_len: int | None = None
        self._prompts: list[int] = []
        self._states: dict[tuple, Any] = {}

    def __call__(self, input_ids, scores):
        new_call = self._prompt_len is None or input_ids.shape[1] <= self._prompt_len
        if new_call:  # a new generate() call
            self._prompt_len = input_ids.shape[1]
            # A state may depend on the row's prompt (the chains constraint reads the offered triples from it), so
            # rows are told apart by their prompt too (hashed once per call); a beam never leaves its prompt's rows.
            self._prompts = [hash(tuple(row)) for row in input_ids.tolist()]
            self._states = {}
        # Only the generated tokens: listing the whole prompt at every step cost more than the constraint.
        rows = input_ids[:, self._prompt_len :].tolist()
        states: dict[tuple, Any] = {}
        masks = []
        for b, generated in enumerate(rows):
            prompt = self._prompts[b]
            key = (prompt, tuple(generated))
            if key in states:
                state = states[key]
            elif not generated:
                state = self.constraint.initial(input_ids[b].tolist())
            elif (prompt, key[1][:-1]) in self._states:
                state = self.constraint.advance(self._states[(prompt, key[1][:-1])], generated[-1])
            else:  # should not happen; recover by walking this row once
                state = self.constraint.initial(input_ids[b, : self._prompt_len].tolist())
                for t in generated:
                    state = self.constraint.advance(state, t)
            states[key] = state
            allowed = self.constraint.allowed(state)
            if allowed is not None:
                masks.append((b, allowed))
        self._states = states
        self.mask_rows(scores, masks)
        return scores

    @staticmethod
    def mask_rows(scores, masks: list[tuple[int, Any]]) -> None:
        """:func:`mask_row` for many rows of a 2-D tensor in four ops: each op per row is a kernel launch (GPU) or
        an OpenMP region (CPU, where a busy machine made each one cost milliseconds)."""
        if not masks:
            return
        if not scores.is_contiguous():
            for b, allowed in masks:
                mask_row(scores[b], allowed)
            return
        import torch

        vocab = scores.shape[-1]
        keep_rows, keep, ban = [], [], []
        for b, allowed in masks:
            if isinstance(allowed, Forbidden):
                ban.append(allowed.ids[allowed.ids < vocab] + b * vocab)
            else:
                keep_rows.append(b)
                keep.append(allowed[allowed < vocab] + b * vocab)
        flat = scores.view(-1)
        if keep_rows:
            index = torch.as_tensor(np.concatenate(keep), device=scores.device)
            kept = flat.index_select(0, index)
            scores.index_fill_(0, torch.as_tensor(keep_rows, device=scores.device), float("-inf"))
            flat.index_copy_(0, index, kept)
        if ban:
            index = np.concatenate(ban)
            if len(index):
                flat.index_fill_(0, torch.as_tensor(index, device=scores.device), float("-inf"))
