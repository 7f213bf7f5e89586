"""The bootstrap behind bench/quality.py's intervals: known inputs, known interval properties (no model)."""

from __future__ import annotations

import sys

import pytest

from paths_helpers import BENCH

sys.path.insert(0, str(BENCH))  # bench/ is scripts, not a package
import quality_stats as stats  # noqa: E402


def test_equal_values_give_a_zero_width_interval():
    got = stats.bootstrap([0.5] * 21)
    assert (got.mean, got.low, got.high) == (0.5, 0.5, 0.5)
    assert got.per_seed == (0.5,)


def test_interval_holds_the_mean_and_stays_in_the_range_of_the_values():
    values = [0, 1] * 10 + [1]  # 11 of 21 questions right
    got = stats.bootstrap(values)
    assert got.mean == pytest.approx(11 / 21)
    assert 0 < got.low < got.mean < got.high < 1
    # a 0/1 mean over 21 questions has a standard error near 0.11: the 95% interval is about ±0.21 wide
    assert 0.3 < got.high - got.low < 0.55


def test_more_questions_narrow_the_interval():
    few, many = stats.bootstrap([0, 1] * 10), stats.bootstrap([0, 1] * 200)
    assert many.high - many.low < (few.high - few.low) / 3


def test_fixed_seed_repeats_and_another_seed_differs():
    values = [0.13, 0.71, 0.42, 0.99, 0.05, 0.58, 0.33, 0.87]  # many distinct means: the percentiles move with the draw
    assert stats.bootstrap(values) == stats.bootstrap(values)
    assert stats.bootstrap(values, seed=1) != stats.bootstrap(values)


def test_seed_lines_that_disagree_widen_the_interval_and_report_each_seed():
    questions = [0.0, 1.0] * 15
    agree = stats.bootstrap([questions, questions])
    disagree = stats.bootstrap([[0.0] * 30, [1.0] * 30])  # the same mean, all of the spread between the seeds
    assert agree.mean == disagree.mean == 0.5
    assert disagree.per_seed == (0.0, 1.0)
    assert disagree.low == 0.0 and disagree.high == 1.0  # two seeds drawn with replacement: both 0, both 1 or one of each
    assert agree.high - agree.low < disagree.high - disagree.low


def test_paired_difference_sign_and_sureness():
    base = [0.0, 0.5, 0.0, 1.0, 0.5, 0.0] * 4
    better = [min(1.0, b + 0.5) for b in base]  # every question at least as good, most better
    up = stats.paired_difference(better, base)
    assert up.mean > 0 and up.low > 0 and up.excludes_zero()
    down = stats.paired_difference(base, better)
    assert down.mean == pytest.approx(-up.mean) and down.high < 0 and down.excludes_zero()
    same = stats.paired_difference(base, base)
    assert (same.mean, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero()


def test_pairing_removes_the_spread_between_questions():
    """Rows that differ by the same small amount on every question: the paired interval is exactly that amount,
    while the two rows' own intervals overlap widely."""
    hard_and_easy = [0.0, 1.0, 0.2, 0.8, 0.4] * 5
    shifted = [v + 0.05 for v in hard_and_easy]
    a, b = stats.bootstrap(shifted), stats.bootstrap(hard_and_easy)
    assert a.low < b.high  # alone, the rows cannot be told apart
    d = stats.paired_difference(shifted, hard_and_easy)
    assert d.low == pytest.approx(0.05) and d.high == pytest.approx(0.05)


def test_a_row_run_once_is_compared_with_every_seed_line():
    base = [0.0, 1.0, 0.0, 1.0]
    trained = [[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    d = stats.paired_difference(trained, base)
    assert d.mean == pytest.approx((0.25 + 0.5) / 2)
    assert d.per_seed == pytest.approx((0.25, 0.5))


def test_rows_that_cannot_be_paired_are_refused():
    with pytest.raises(ValueError, match="same questions"):
        stats.paired_difference([1.0, 0.0], [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="seed lines"):
        stats.paired_difference([[1.0], [0.0]], [[1.0], [0.0], [1.0]])
    with pytest.raises(ValueError, match="non-empty"):
        stats.bootstrap([])
