"""vLLM v1 logits processor for hybrid docid decoding.

Pass the class to the engine and name the constraint per request, as an index directory (special markers) or
a spec of :mod:`grtool.index.constraints` (``Sampling.constraint``; bracket markers need the model's tokenizer,
which the processor loads from the engine's config)::

    llm = LLM(model, logits_processors=[DocidVllmLogitsProcessor])
    llm.generate(prompts, SamplingParams(extra_args={"docid_index": "out/run/index"}))
    llm.generate(prompts, SamplingParams(extra_args={"docid_index": {"index": "out/run/index", "markers": "brackets"}}))

Requests without ``docid_index`` are left alone. vLLM hands each request's live output-token list to
``update_state``; ``apply`` advances the request's state by the tokens added since the last step. Not in
``update_state``: under async scheduling (vLLM's default on GPU) the last sampled token is still a ``-1``
placeholder there, and vLLM fills it in only just before the sampler runs the logits processors.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from grtool.index.constraints import constraint_from_spec
from grtool.index.decoding import DocidLogitsProcessor

EXTRA_ARG = "docid_index"


class _Request:
    __slots__ = ("constraint", "prompt", "state", "outputs", "seen")

    def __init__(self, constraint, prompt: list[int] | None, outputs: list[int]):
        self.constraint = constraint
        self.prompt = prompt or []
        self.state = constraint.initial(self.prompt)
        self.outputs = outputs  # vLLM's running list of this request's output tokens
        self.seen = 0

    def catch_up(self) -> None:
        outputs = self.outputs
        if self.seen > len(outputs):  # vLLM dropped tokens (rejected drafts, a failed KV load): walk again
            self.state, self.seen = self.constraint.initial(self.prompt), 0
        while self.seen < len(outputs):
            token = outputs[self.seen]
            if token < 0:  # an async-scheduling placeholder: its token is not known yet
                break
            self.state = self.constraint.advance(self.state, token)
            self.seen += 1


class DocidVllmLogitsProcessor(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params) -> None:
        path = (sampling_params.extra_args or {}).get(EXTRA_ARG)
        if path is not None and not isinstance(path, (str, dict)):
            raise ValueError(f"extra_args[{EXTRA_ARG!r}] must be an index directory path or a constraint spec")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.requests: dict[int, _Request] = {}
        self._tokenizer_source = vllm_config.model_config.tokenizer
        self._tokenizer = None

    def _constraint(self, spec):
        if isinstance(spec, str):
            spec = {"index": spec, "markers": "special"}
        tokenizer = None
        if spec.get("markers") == "brackets":
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_source).backend_tokenizer
            tokenizer = self._tokenizer
        return constraint_from_spec(spec, tokenizer)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token wins

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                self.requests.pop(index, None)
            for index, params, prompt, outputs in batch_update.added:
                path = (params.extra_args or {}).get(EXTRA_ARG) if params is not None else None
                if path:
                    self.requests[index] = _Request(self._constraint(path), prompt, outputs)
                else:
                    self.requests.pop(index, None)
            for a, b, direction in batch_update.moved:
                ra, rb = self.requests.pop(a, None), self.requests.pop(b, None)
                if ra is not None:
                    self.requests[b] = ra
                if rb is not None and direction == MoveDirectionality.SWAP:
                    self.requests[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        masks = []
        for index, request in self.requests.items():
            request.catch_up()
            allowed = request.constraint.allowed(request.state)
            if allowed is not None:
                masks.append((index, allowed))
        DocidLogitsProcessor.mask_rows(logits, masks)  # a few batched ops, not a few per row
        return logits
