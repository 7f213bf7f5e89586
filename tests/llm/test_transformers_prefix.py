"""The transformers backend computes the prompt prefix every request shares once and reuses it in every batch:
generations must be exactly those of plain left-padded batches (real model, real stage prompts)."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES
from grtool.llm import Sampling, make_backend
from grtool.llm.transformers_backend import _SharedPrefix
from grtool.triples.prompt import load_prompt


def _example_paragraphs(n: int) -> list[tuple[str, str]]:
    records = json.loads((EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_text())
    found = [(title, "".join(sentences)) for rec in records for title, sentences in rec["context"]]
    # Lengths that differ, so rows of one batch need padding between the shared prefix and their own tokens.
    return sorted(found, key=lambda p: len(p[1]))[:: max(1, len(found) // n)][:n]


@pytest.mark.slow
def test_shared_prefix_reuse_gives_the_plain_generations():
    backend = make_backend("transformers", batch_size=3, threads=1)
    prompt = load_prompt()
    prompts = [prompt.messages(title, text) for title, text in _example_paragraphs(5)]
    sampling = Sampling(max_tokens=12, logprobs=2)

    reused = backend.generate(prompts, sampling)
    shared = len(backend._prefix.ids)
    assert shared > 500, "the triples system prompt and examples are shared by every request"

    backend._prefix = _SharedPrefix(backend.lm)
    backend._prefix.MIN_TOKENS = 10**9  # reuse off: plain left-padded batches
    plain = backend.generate(prompts, sampling)
    assert backend._prefix.cache is None

    assert [g.text for g in reused] == [g.text for g in plain]
    assert [g.finish_reason for g in reused] == [g.finish_reason for g in plain]
    assert [g.prompt_tokens for g in reused] == [g.prompt_tokens for g in plain]
    assert all(g.prompt_tokens > shared for g in reused)
    for a, b in zip(reused, plain):
        assert [t.token for t in a.logprobs] == [t.token for t in b.logprobs]
        assert all(abs(x.logprob - y.logprob) < 1e-3 for x, y in zip(a.logprobs, b.logprobs))


@pytest.mark.slow
def test_prefix_follows_the_prompts_it_is_given():
    backend = make_backend("transformers", batch_size=2)
    prompt = load_prompt()
    first = [prompt.messages(t, x) for t, x in _example_paragraphs(2)]
    backend.generate(first, Sampling(max_tokens=2))
    kept = list(backend._prefix.ids)
    # Other prompts sharing nothing long: no reuse, and the generations still come back in order.
    other = [[{"role": "user", "content": "Say yes."}], [{"role": "user", "content": "Name a colour."}]]
    gens = backend.generate(other, Sampling(max_tokens=3))
    assert len(gens) == 2 and backend._prefix.cache is None
    assert [g.text for g in gens] == [backend.generate([p], Sampling(max_tokens=3))[0].text for p in other]
    backend.generate(first, Sampling(max_tokens=2))
    assert backend._prefix.ids == kept


@pytest.mark.slow
def test_generations_equal_stock_transformers_generate():
    """Grouped-head attention and the in-place cache change the speed, not the tokens: compare with a stock
    left-padded ``model.generate`` (transformers' own sdpa attention and DynamicCache) on the same model."""
    import torch
    from transformers import AutoModelForCausalLM

    backend = make_backend("transformers", batch_size=4)
    assert backend.lm.config._attn_implementation == "grtool_grouped_sdpa"
    prompt = load_prompt()
    prompts = [prompt.messages(title, text) for title, text in _example_paragraphs(4)]
    ours = backend.generate(prompts, Sampling(max_tokens=24))

    stock = AutoModelForCausalLM.from_pretrained(backend.lm.name_or_path, attn_implementation="sdpa").eval()
    tok = backend.tokenizer
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = stock.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
    expected = [tok.decode(row[enc["input_ids"].shape[1] :], skip_special_tokens=True) for row in out]
    assert [g.text for g in ours] == expected


@pytest.mark.slow
def test_a_row_that_stops_early_has_its_own_latency(monkeypatch):
    """latency_ms is per row: one that hit EOS while the batch went on was done earlier than the batch. The
    backend's clock ticks one second per reading (the start, each decoding step, the end), so the latencies are
    exact whatever the machine's load (with the wall clock, a busy CI machine's prefill broke a ratio bound)."""
    import itertools
    import types

    from grtool.llm import transformers_backend

    ticks = itertools.count()
    monkeypatch.setattr(transformers_backend, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    backend = make_backend("transformers", batch_size=2, threads=2)
    short = [{"role": "user", "content": "What is 2 + 2? Answer with the number only."}]
    long = [{"role": "user", "content": "Count from 1 to 200, separated by commas."}]
    early, full = backend.generate([short, long], Sampling(max_tokens=48))
    assert early.finish_reason == "stop" and early.completion_tokens < 40, early
    assert full.finish_reason == "length" and full.completion_tokens == 48, full
    # the batch's time for both before; now the early row's ends at its last token's step, the other at the end
    assert early.latency_ms == early.completion_tokens * 1000 and full.latency_ms == (48 + 1) * 1000, (early, full)
