"""`chains synthesize --constrain`: citations can only be the triples the prompt offers (either way round).

Real embedded model (SmolLM2-135M, CPU) on the samples corpus (our own 2WikiMultihopQA records) with their evidence triples
(``sample_helpers.build_samples``), cut to the questions where the free model cites triples it was not offered
(``sample_helpers.CITING_QUESTIONS``); the constraint reads each row's offered triples from its own prompt, their flips from the triples' parts.
"""

from __future__ import annotations

import pytest
from conftest import run_cli
from sample_helpers import CITING_QUESTIONS, build_samples, keep_questions

from grtool.chains.prompt import user_turn
from grtool.index.constraints import offered_docids
from grtool.store.records import load_manifest
from grtool.store.stage import read_table


def test_offered_docids_read_back_what_the_prompt_lists():
    triples = [("Walkman", "manufacturer", "Sony"), ("Sony", "founded by", "Masaru Ibuka, Akio Morita")]
    earlier = user_turn("An example question?", [("Rusalka", "composer of", "Antonín Dvořák")])
    text = f"{earlier}\nassistant: ... [Rusalka, composer of, Antonín Dvořák]\n{user_turn('Who founded it?', triples)}"
    assert offered_docids(text, triples) == [
        "Walkman, manufacturer, Sony", "Sony, manufacturer, Walkman",
        "Sony, founded by, Masaru Ibuka, Akio Morita", "Masaru Ibuka, Akio Morita, founded by, Sony",
    ]  # fmt: skip
    assert offered_docids("no list here") == []
    # without the parts a listed text is offered as written only, never flipped by cutting it at its commas
    assert offered_docids(text) == ["Walkman, manufacturer, Sony", "Sony, founded by, Masaru Ibuka, Akio Morita"]


@pytest.mark.slow
def test_constrained_chains_cite_only_offered_triples(tmp_path):
    root = tmp_path / "run"
    build_samples(root)
    keep_questions(root, CITING_QUESTIONS)
    common = ("--triples", root / "triples", "--candidates", "1", "--max-tokens", "48", "--select", "first")
    out = tmp_path / "chains"
    run_cli("chains", "synthesize", root, "--out", out, *common)
    extra = load_manifest(out).counters.extra
    assert extra["docids"] > 0
    assert extra["docids_not_offered"] == 0, extra
    rows = read_table(out).to_pylist()
    assert len(rows) == len(CITING_QUESTIONS) and all(r["docids"] is not None for r in rows)
    # the same run unconstrained cites triples that were not offered (what the constraint prevents)
    free = tmp_path / "free"
    run_cli("chains", "synthesize", root, "--out", free, *common, "--no-constrain")
    assert load_manifest(free).counters.extra["docids_not_offered"] > 0
