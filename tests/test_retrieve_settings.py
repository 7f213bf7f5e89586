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


def test_system_prompt_is_the_one_export_sft_trains_with(tmp_path):
    """--system comes first, as in the rows `export sft --system` writes; --mode gmr (no system in `export gmr`) refuses it."""
    from pathlib import Path

    from conftest import run_cli

    from grtool.export.formats import instruction, sft_row
    from grtool.retrieve.run import RetrieveRequest, retrieve_prompt

    request = RetrieveRequest(corpus="unused", index=Path("unused"), out=tmp_path / "out", few_shot=0, system="Answer with docids.")
    sent = retrieve_prompt(request, None).messages("q1", "Who wrote it?")
    trained = sft_row("trl-messages", instruction("Who wrote it?", "special"), "answer", "Answer with docids.")["messages"]
    assert sent == trained[:-1]
    assert retrieve_prompt(request, None).sha256() != retrieve_prompt(RetrieveRequest(corpus="unused", index=Path("unused"), out=tmp_path / "out", few_shot=0), None).sha256()
    proc = run_cli("retrieve", tmp_path, "--index", tmp_path / "index", "--mode", "gmr", "--system", "x", "--out", tmp_path / "out", check=2)
    assert "--system" in proc.stderr and "export gmr" in proc.stderr and not (tmp_path / "out").exists()
