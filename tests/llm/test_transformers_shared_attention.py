"""A batch reads the shared prompt prefix's keys and values once (one copy, batch 1) and merges that attention with
each row's own: the result must be plain attention over the prefix and the row's keys together, whatever the mask."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from grtool.llm.transformers_backend import _attention_with_shared_prefix  # noqa: E402


def _plain(query, prefix_k, prefix_v, own_k, own_v, own_mask):
    """SDPA over [prefix, own] keys with the prefix copied into every row and the heads of a group repeated."""
    batch, heads = query.shape[:2]
    per_group = heads // own_k.shape[1]
    keys = torch.cat([prefix_k.expand(batch, -1, -1, -1), own_k], 2).repeat_interleave(per_group, 1)
    values = torch.cat([prefix_v.expand(batch, -1, -1, -1), own_v], 2).repeat_interleave(per_group, 1)
    visible = torch.ones((*own_mask.shape[:-1], prefix_k.shape[2]), dtype=torch.bool)
    mask = torch.cat([visible, own_mask], -1)
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=mask).transpose(1, 2)


def _tensors(batch=3, heads=6, groups=2, q_len=4, prefix=17, own=9, dim=8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, q_len, dim, generator=g)
    pk, pv = torch.randn(1, groups, prefix, dim, generator=g), torch.randn(1, groups, prefix, dim, generator=g)
    ok, ov = torch.randn(batch, groups, own, dim, generator=g), torch.randn(batch, groups, own, dim, generator=g)
    return q, pk, pv, ok, ov


def test_padded_rows_with_a_mask_equal_plain_attention():
    q, pk, pv, ok, ov = _tensors()
    batch, q_len, own = q.shape[0], q.shape[2], ok.shape[2]
    causal = torch.ones(q_len, own, dtype=torch.bool).tril(own - q_len)
    own_mask = causal.expand(batch, 1, q_len, own).clone()
    own_mask[1, :, :, :3] = False  # row 1 left-padded by 3 keys
    own_mask[2, :, 0, :] = False  # a padding query that sees none of its row's keys: only the prefix
    full = torch.cat([torch.ones(batch, 1, q_len, pk.shape[2], dtype=torch.bool), own_mask], -1)
    got = _attention_with_shared_prefix(q, ok, ov, (pk, pv), full, None)
    assert not got.isnan().any()
    assert torch.allclose(got, _plain(q, pk, pv, ok, ov, own_mask), atol=1e-5)


def test_one_query_and_no_mask_equal_plain_attention():
    q, pk, pv, ok, ov = _tensors(q_len=1)
    everything = torch.ones(q.shape[0], 1, 1, ok.shape[2], dtype=torch.bool)
    got = _attention_with_shared_prefix(q, ok, ov, (pk, pv), None, None)
    assert torch.allclose(got, _plain(q, pk, pv, ok, ov, everything), atol=1e-5)


def test_several_queries_without_a_mask_are_causal_from_the_last_key():
    q, pk, pv, ok, ov = _tensors(q_len=4, own=9)
    causal = torch.ones(4, 9, dtype=torch.bool).tril(9 - 4).expand(q.shape[0], 1, 4, 9)
    got = _attention_with_shared_prefix(q, ok, ov, (pk, pv), None, None)
    assert torch.allclose(got, _plain(q, pk, pv, ok, ov, causal), atol=1e-5)


@pytest.mark.slow
def test_requests_that_write_logprobs_keep_a_copy_of_the_prefix_per_row(monkeypatch):
    """The merged softmaxes move log-probabilities in their last digits: a request that writes them out (chains'
    entropy) computes them as before, a plain request reads the one shared copy; their texts are the same."""
    import json

    from conftest import EXAMPLES
    from grtool.llm import Sampling, make_backend
    from grtool.llm.transformers_backend import _SharedPrefix
    from grtool.triples.prompt import load_prompt

    records = json.loads((EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_text())
    paragraphs = [(title, "".join(sentences)) for rec in records for title, sentences in rec["context"]][:3]
    prompt = load_prompt()
    prompts = [prompt.messages(title, text) for title, text in paragraphs]
    backend = make_backend("transformers", batch_size=3)
    shared: list[bool] = []
    batch_inputs = _SharedPrefix.batch_inputs
    monkeypatch.setattr(_SharedPrefix, "batch_inputs", lambda self, ids, pad, share=False: shared.append(share) or batch_inputs(self, ids, pad, share))
    plain = backend.generate(prompts, Sampling(max_tokens=6))
    with_logprobs = backend.generate(prompts, Sampling(max_tokens=6, logprobs=1))
    assert shared == [True, False]
    assert [g.text for g in plain] == [g.text for g in with_logprobs]
