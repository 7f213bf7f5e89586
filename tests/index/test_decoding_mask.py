"""DocidLogitsProcessor.mask_rows: the batched masking is exactly mask_row applied row by row."""

from __future__ import annotations

import numpy as np
import pytest

from grtool.index.decoding import DocidLogitsProcessor, Forbidden, mask_row


@pytest.mark.parametrize("contiguous", [True, False])
def test_mask_rows_equals_mask_row_per_row(contiguous):
    import torch

    rng = np.random.default_rng(0)
    vocab = 50
    masks = [
        (0, np.array([1, 7, 49, 60], dtype=np.int64)),  # 60 is past the width
        (2, Forbidden(np.array([0, 3, 99], dtype=np.int64))),
        (3, np.array([5], dtype=np.int64)),
        (5, Forbidden(np.array([70], dtype=np.int64))),  # nothing inside the width
    ]  # rows 1 and 4: unconstrained
    base = torch.as_tensor(rng.normal(size=(6, vocab)), dtype=torch.float32)
    expected = base.clone()
    for b, allowed in masks:
        mask_row(expected[b], allowed)
    scores = base.clone() if contiguous else base.t().contiguous().t()  # same values, column-major
    assert scores.is_contiguous() == contiguous
    DocidLogitsProcessor.mask_rows(scores, masks)
    assert torch.equal(scores, expected)
    DocidLogitsProcessor.mask_rows(scores, [])  # nothing to mask
    assert torch.equal(scores, expected)
