"""How sure is a quality number: bootstrap intervals over test questions (and training seeds) for bench/quality.py.

A row's scores are a matrix, one line per training seed and one column per test question (a row that does not
train, e.g. the base model, has one line). Each bootstrap resample draws the questions with replacement and,
independently, the seeds with replacement, and takes the mean of the drawn cells; the 2.5th and 97.5th
percentiles of those means are the 95% interval (percentile bootstrap). Drawing the seeds too widens the
interval by the spread between training runs, which a question-only bootstrap of one seed cannot show; with 2 or
3 seeds that part is coarse, so the per-seed means are reported beside it.

A difference between two rows is bootstrapped paired: the same questions are drawn for both (a question that is
hard for one is usually hard for the other), and rows trained from the same seeds (KTO continues the SFT run of
its seed) share the drawn seeds too; a one-line row (the base) is compared with every seed line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    per_seed: tuple[float, ...]  # the mean over questions of each seed line

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def text(self, digits: int = 3) -> str:
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def as_matrix(values) -> np.ndarray:
    """Seeds × questions as floats; a flat list is one seed line."""
    m = np.asarray(values, dtype=float)
    if m.ndim == 1:
        m = m[None, :]
    if m.ndim != 2 or m.size == 0:
        raise ValueError(f"scores must be a non-empty list or seeds × questions matrix, got shape {m.shape}")
    return m


def bootstrap(values, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """Mean and percentile-bootstrap interval of a seeds × questions matrix (see the module docstring)."""
    m = as_matrix(values)
    n_seeds, n_questions = m.shape
    rng = np.random.default_rng(seed)
    q = rng.integers(0, n_questions, size=(resamples, n_questions))
    s = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    # mean over the drawn seed lines and drawn questions: per resample, average m[s_i][:, q_i]
    means = np.array([m[s[i]][:, q[i]].mean() for i in range(resamples)])
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(m.mean()), float(low), float(high), tuple(float(x) for x in m.mean(axis=1)))


def paired_difference(a, b, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval:
    """Row A minus row B on the same questions (columns in the same order): seed lines are paired when both rows
    have as many, a one-line row is compared with each line of the other."""
    ma, mb = as_matrix(a), as_matrix(b)
    if ma.shape[1] != mb.shape[1]:
        raise ValueError(f"paired rows need the same questions: {ma.shape[1]} against {mb.shape[1]}")
    if ma.shape[0] != mb.shape[0] and 1 not in (ma.shape[0], mb.shape[0]):
        raise ValueError(f"seed lines cannot be paired: {ma.shape[0]} against {mb.shape[0]}")
    return bootstrap(ma - mb, resamples, seed, level)
