"""Is a difference in recall more than noise? The paired tests of `grtool eval compare`.

Over the questions both runs answered, the per-question differences d = recall(run) − recall(baseline):

- **p-value**: a two-sided paired approximate randomization test (Noreen 1989; the sign-flip test IR uses for
  paired runs): under "no difference" each d is as likely −d, so the mean of d with random signs is drawn
  :data:`RESAMPLES` times and p = (draws at least as far from 0 as the observed mean + 1) / (draws + 1). Runs
  with identical recall on every question get p = 1.
- **95% interval** of the mean difference: the paired percentile bootstrap (questions resampled with
  replacement, :data:`RESAMPLES` times).

Both draw from numpy's generator seeded with :data:`SEED`, so a table is the same every time it is made.
"""

from __future__ import annotations

from typing import Any

TEST = "paired approximate randomization (sign flips), two-sided; 95% interval: paired percentile bootstrap"
RESAMPLES = 10_000
SEED = 0
CHUNK = 500  # resamples drawn at once (a 500 × questions matrix)
SAME = 1e-12  # float sums of equal fractions can differ in the last digits


def paired_test(base: dict[str, float], run: dict[str, float], *, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """Mean difference, its 95% interval and the two-sided p-value over the questions in both ``base`` and ``run``
    (qid → recall). None figures when no question is in both."""
    import numpy as np

    common = sorted(base.keys() & run.keys())
    result: dict[str, Any] = {"test": TEST, "resamples": resamples, "seed": seed, "questions": len(common),
                              "difference": None, "ci95": None, "p_value": None}  # fmt: skip
    if not common:
        return result
    d = np.array([run[q] - base[q] for q in common], dtype=np.float64)
    n, observed = len(d), float(d.mean())
    rng = np.random.default_rng(seed)
    as_far = 0
    means: list[Any] = []
    for start in range(0, resamples, CHUNK):
        size = min(CHUNK, resamples - start)
        signs = rng.integers(0, 2, size=(size, n), dtype=np.int8) * 2 - 1
        as_far += int(np.count_nonzero(np.abs(signs @ d / n) >= abs(observed) - SAME))
        means.append(d[rng.integers(0, n, size=(size, n))].mean(axis=1))
    low, high = np.percentile(np.concatenate(means), [2.5, 97.5])
    result.update(difference=observed, ci95=[float(low), float(high)], p_value=(as_far + 1) / (resamples + 1))
    return result
