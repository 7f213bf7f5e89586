"""Hybrid constrained decoding with a real model (SmolLM2-135M on the CPU): transformers and vLLM adapters.

Every docid generated under the constraint must exist in the index. The model never saw the docid markers,
so the tests either end the prompt with <docid_start> or force the marker mid-generation with a second
logits processor (a stand-in for a model trained to emit it); the constraint does the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROMPT = "Facts about bridges and rivers in northern Germany:"


@pytest.fixture(scope="module")
def docid_model(tmp_path_factory):
    """The shared default model folder, copied with the index's tokenizer (markers added) and resized
    embeddings, plus an FM index and a trie over the bundled triples built with that tokenizer."""
    from transformers import AutoModelForCausalLM

    from grtool.index.build import build_index
    from grtool.models import resolve_model

    base = Path(resolve_model(None).path)
    root = tmp_path_factory.mktemp("docid_model")
    stage = _bundled_stage(root / "triples")
    for kind in ("fm", "trie"):
        build_index(stage, root / f"index_{kind}", tokenizer=str(base), kind=kind)
    model_dir = root / "model"
    model = AutoModelForCausalLM.from_pretrained(str(base))
    vocab = json.loads((root / "index_fm" / "index.json").read_text())["tokenizer"]["vocab_size"]
    model.resize_token_embeddings(vocab)
    model.save_pretrained(str(model_dir))
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, model_dir / f.name)
    shutil.copy(root / "index_fm" / "tokenizer.json", model_dir / "tokenizer.json")
    yield root, model_dir
    shutil.rmtree(root, ignore_errors=True)  # 0.5 GB of weights: gone with the module, not at the session's end


def _bundled_stage(path: Path) -> Path:
    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter
    from index_helpers import BUNDLED  # not at the top: the vLLM test runs this file as a script, tests/ off sys.path

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    stage = StageWriter(path, StageSpec("triples", TRIPLES))
    with stage.shard(0) as sh:
        sh.count_in(len(rows))
        sh.write_rows(rows)
    stage.finish()
    return path


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(model_dir)).eval(), AutoTokenizer.from_pretrained(str(model_dir))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fm", "trie"])
def test_transformers_constrained_docids_exist(docid_model, kind):
    import torch
    from transformers import LogitsProcessorList

    from grtool.index.base import Index
    from grtool.index.decoding import DocidLogitsProcessor, docids_in

    root, model_dir = docid_model
    index = Index.open(root / f"index_{kind}")
    model, tok = _load(model_dir)
    ds, de = index.start_id, index.end_id
    prompt = tok(PROMPT + " <docid_start>", return_tensors="pt").input_ids
    assert prompt[0, -1].item() == ds
    runs = [dict(do_sample=True, temperature=1.5, num_return_sequences=4, seed=0)]
    if kind == "fm":  # greedy and beam search once; the trie gets the same walks through sampling
        runs += [dict(do_sample=False), dict(num_beams=3, num_return_sequences=3, do_sample=False)]
    found = set()
    for opts in runs:
        seed = opts.pop("seed", 0)
        torch.manual_seed(seed)
        out = model.generate(prompt, max_new_tokens=28, logits_processor=LogitsProcessorList([DocidLogitsProcessor(index)]),
                             pad_token_id=tok.eos_token_id, **opts)  # fmt: skip
        for row in out.tolist():
            spans = docids_in(row, ds, de)
            assert spans, f"no complete docid in {tok.decode(row)!r}"
            for span in spans:
                assert index.docs_of(span), f"generated docid not in the index: {tok.decode(span)!r}"
                found.add(tok.decode(span))
    assert len(found) >= 2  # sampling explores different docids, all of them real


class _ForceMarkerAt:
    """Forces <docid_start> at one generation step (what a trained model would write itself)."""

    def __init__(self, prompt_len: int, step: int, token: int):
        self.at, self.token = prompt_len + step, token

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.at:
            scores[:, :] = float("-inf")
            scores[:, self.token] = 0.0
        return scores


@pytest.mark.slow
def test_transformers_hybrid_free_text_docid_free_text(docid_model):
    from transformers import LogitsProcessorList

    from grtool.index.base import Index
    from grtool.index.decoding import DocidLogitsProcessor, docids_in

    root, model_dir = docid_model
    index = Index.open(root / "index_fm")
    model, tok = _load(model_dir)
    ds, de = index.start_id, index.end_id
    prompt = tok(PROMPT, return_tensors="pt").input_ids
    n = prompt.shape[1]
    free = model.generate(prompt, max_new_tokens=36, do_sample=False, pad_token_id=tok.eos_token_id)[0].tolist()
    steps = LogitsProcessorList([_ForceMarkerAt(n, 4, ds), DocidLogitsProcessor(index)])
    out = model.generate(prompt, max_new_tokens=36, min_new_tokens=36, do_sample=False, logits_processor=steps,
                         pad_token_id=tok.eos_token_id)[0].tolist()  # fmt: skip
    assert out[: n + 4] == free[: n + 4]  # free text before the marker is untouched by the constraint
    assert out[n + 4] == ds
    spans = docids_in(out, ds, de)
    assert spans and index.docs_of(spans[0])
    after = out[out.index(de, n) + 1 :]
    assert after, "generation continues after <docid_end>"
    # after the docid the text is free again: the same as unconstrained decoding from that point
    resumed = model.generate(
        __import__("torch").tensor([out[: len(out) - len(after)]]), max_new_tokens=len(after), min_new_tokens=len(after),
        do_sample=False, pad_token_id=tok.eos_token_id,
    )[0].tolist()  # fmt: skip
    assert resumed == out


def test_constraint_state_machine_is_incremental(docid_model):
    """The per-sequence state advances by one extend per token and resumes a docid begun in the prompt."""
    from grtool.index.base import Index
    from grtool.index.decoding import DocidConstraint

    root, _ = docid_model
    index = Index.open(root / "index_fm")
    c = DocidConstraint(index)
    ids = index.tokenizer.encode("<docid_start>Kiel, capital of, Schleswig-Holstein<docid_end>")
    calls = []
    real_extend = index.extend
    index.extend = lambda st, t: calls.append(t) or real_extend(st, t)
    state = c.initial(index.tokenizer.encode("Some text"))
    assert c.allowed(state) is None
    for i, t in enumerate(ids):
        if i:
            assert t in c.allowed(state).tolist()
        state = c.advance(state, t)
    assert calls == ids[:-1] and c.allowed(state) is None  # one extend per token, free after <docid_end>
    mid = c.initial(ids[:3])
    assert c.allowed(mid).tolist() == index.next_tokens(index.walk(ids[:3]))[0].tolist()
    dead = c.initial(index.tokenizer.encode("<docid_start>Nowhere at all"))
    assert c.allowed(dead).tolist() == [index.end_id]  # an unknown prefix can only be closed


# --------------------------------------------------------------------------------------------- vLLM


@pytest.mark.slow
def test_vllm_constrained_docids_exist(docid_model, tmp_path):
    pytest.importorskip("vllm")
    from vllm_helpers import VLLM_INPROC_ENV

    root, model_dir = docid_model
    proc = subprocess.run(
        [sys.executable, __file__, str(model_dir), str(root / "index_fm")],
        capture_output=True, text=True, timeout=1200, env={**os.environ, **VLLM_INPROC_ENV},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])
    from grtool.index.base import Index
    from grtool.index.decoding import docids_in

    index = Index.open(root / "index_fm")
    docids = 0
    for ids in result["constrained"]:
        spans = docids_in([index.start_id, *ids], index.start_id, index.end_id)
        assert spans, ids
        for span in spans:
            assert index.docs_of(span), span
            docids += 1
    assert docids >= 3
    # a request without docid_index is not touched: same greedy output as without the processor
    assert result["plain_with_processor"] == result["plain_without_processor"]


def _vllm_main(model_dir: str, index_dir: str) -> None:
    from vllm import LLM, SamplingParams

    from grtool.index.vllm_processor import DocidVllmLogitsProcessor

    llm = LLM(model=model_dir, enforce_eager=True, max_model_len=256, seed=0, logits_processors=[DocidVllmLogitsProcessor])
    constrained = SamplingParams(max_tokens=40, temperature=1.2, seed=0, n=1, extra_args={"docid_index": index_dir})
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    prompts = [PROMPT + " <docid_start>", "Rivers of the north: <docid_start>", "Who designed it? <docid_start>"]
    outs = llm.generate(prompts + [PROMPT], [constrained] * len(prompts) + [greedy], use_tqdm=False)
    result = {
        "constrained": [list(o.outputs[0].token_ids) for o in outs[: len(prompts)]],
        "plain_with_processor": list(outs[-1].outputs[0].token_ids),
    }
    llm2 = LLM(model=model_dir, enforce_eager=True, max_model_len=256, seed=0)
    result["plain_without_processor"] = list(llm2.generate([PROMPT], greedy, use_tqdm=False)[0].outputs[0].token_ids)
    print("RESULT " + json.dumps(result), flush=True)  # vLLM may log on stdout too


if __name__ == "__main__":
    _vllm_main(sys.argv[1], sys.argv[2])
