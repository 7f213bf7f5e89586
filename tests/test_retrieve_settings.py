"""`grtool retrieve`'s settings without a model run: sampling, the system prompt, few-shot sources, flips, latency."""

from __future__ import annotations

from grtool.retrieve.run import sampling_temperature
from grtool.retrieve.stage import RetrieveSettings


def test_one_sample_at_a_temperature_is_sampled_and_seeded():
    """--samples 1 --temperature 0.8 samples (seed --seed); without --temperature one sample stays greedy."""
    sampled = RetrieveSettings(samples=1, temperature=sampling_temperature(1, 0.8), seed=5).sampling(0, {})
    assert (sampled.temperature, sampled.seed) == (0.8, 5)
    assert RetrieveSettings(samples=1, temperature=sampling_temperature(1, None)).sampling(0, {}).temperature == 0.0
    assert sampling_temperature(4, None) > 0  # several samples without --temperature: sampled
    assert sampling_temperature(4, 0.0) == 0.0  # (refused by retrieve: N copies of the greedy response)
