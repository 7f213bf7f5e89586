"""Local generation with Hugging Face transformers (CPU or one GPU), batched, with the tokenizer's chat template.

The default model is the embedded SmolLM2-135M-Instruct (see :mod:`grtool.models`). A JSON schema in
:class:`Sampling` is part of the cache key and is left to the prompt; a docid constraint (``Sampling.constraint``,
`grtool retrieve`) runs as a logits processor (:mod:`grtool.index.decoding`).
"""

from __future__ import annotations

import copy
import functools
import time
from pathlib import Path
from typing import Any

from grtool.errors import GrtoolError, InputError, MissingDependency
from grtool.llm.base import Generation, Messages, OnDone, Sampling, TokenLogprobs, context_check, not_generated
from grtool.models import context_length, resolve_model, weights_digest
from grtool.log import activity, activity_detail, log, quiet_libraries


class TransformersBackend:
    name = "transformers"
    OPTIONS = ("batch_size", "device", "dtype", "threads", "adapter")

    def __init__(
        self,
        model: str | None = None,
        *,
        batch_size: int = 8,
        device: str | None = None,
        dtype: str = "auto",
        threads: int | None = None,
        adapter: str | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # grtool draws its own progress on stderr
        quiet_libraries()  # in a log: transformers' warnings as grtool's stamped lines
        if threads:  # else torch's default: one thread per CPU this process may use (OMP_NUM_THREADS overrides it)
            torch.set_num_threads(threads)
        ref = resolve_model(model)
        self.model = ref.name
        self.batch_size = max(1, batch_size)
        # Prompts per generate call: sorted by length inside it (less padding), cached after it (crash loss).
        self.chunk_size = self.batch_size * 8
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        with activity(f"loading model {ref.name} on {self.device}"):
            from grtool.models import check_chat_template, check_tokenizer, embedding_rows

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(ref.path)
            except Exception as e:  # noqa: BLE001  (transformers' advice, e.g. to install sentencepiece, would mislead)
                raise GrtoolError(f"--model {ref.name}: cannot load its tokenizer with transformers ({_first_line(e)})") from None
            check_tokenizer(self.tokenizer, ref.name, embedding_rows(ref.path))
            try:
                self.lm = AutoModelForCausalLM.from_pretrained(ref.path, dtype=dtype).to(self.device).eval()
            except Exception as e:  # noqa: BLE001
                raise GrtoolError(f"--model {ref.name}: cannot load it with transformers ({_first_line(e)})") from None
            if adapter is not None:
                self.lm = _with_adapter(self.lm, adapter)
                self.model = f"{ref.name}+{Path(adapter).name}@{weights_digest(adapter)}"
        if self.tokenizer.chat_template is None:
            raise GrtoolError(f"model {ref.name!r}: its tokenizer has no chat template")
        check_chat_template(self.tokenizer, f"--model {ref.name}")
        self.tokenizer.padding_side = "left"  # generation continues from the right edge of every row
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.context_length = context_length(self.lm.config, self.tokenizer)
        self._warned_schema = False
        self._prefix = _SharedPrefix(self.lm)
        if self.device == "cpu" and self.lm.config._attn_implementation == "sdpa":
            self.lm.set_attn_implementation(_grouped_sdpa())

    def generate(self, prompts: list[Messages], sampling: Sampling, on_done: OnDone | None = None) -> list[Generation]:
        if sampling.json_schema is not None and not self._warned_schema:
            log.warning("the transformers backend cannot constrain output to a JSON schema; relying on the prompt")
            self._warned_schema = True
        texts = [self.tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
        ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        results: list[Generation | None] = [None] * len(ids)
        # A prompt beyond the context is not generated: the model would answer from positions it never saw.
        for i, row in enumerate(ids):
            why = context_check(len(row), sampling.max_tokens, self.context_length)
            if why is not None:
                results[i] = not_generated(why, len(row))
        refused = [g for g in results if g is not None]
        if refused and on_done is not None:
            on_done(refused)
        fitting = [i for i, g in enumerate(results) if g is None]
        if not fitting:
            return results  # type: ignore[return-value]
        prefix = self._prefix.shared_by([ids[i] for i in fitting])
        # Similar lengths in one batch waste less padding; results go back in the callers' order.
        order = sorted(fitting, key=lambda i: len(ids[i]))
        batches = -(-len(order) // self.batch_size)
        for k, start in enumerate(range(0, len(order), self.batch_size), 1):
            idx = order[start : start + self.batch_size]
            with activity(f"generating batch {k}/{batches} ({len(idx)} prompt{'s' if len(idx) != 1 else ''})"):
                batch = self._generate_batch([ids[i] for i in idx], prefix, sampling)
            for i, g in zip(idx, batch):
                results[i] = g
            if on_done is not None:  # progress per batch, not per call
                on_done(list(batch))
        return results  # type: ignore[return-value]

    def _generate_batch(self, ids: list[list[int]], prefix: "_SharedPrefix", sampling: Sampling) -> list[Generation]:
        import torch

        # One copy of the prefix for the whole batch (see _attention_with_shared_prefix): its sums run in another
        # order, which moves log-probabilities in their 7th digit; requests that write them out keep a copy per row.
        share = sampling.beams == 1 and not sampling.logprobs and self.lm.config._attn_implementation == GROUPED_SDPA
        enc = prefix.batch_inputs(ids, self.tokenizer.pad_token_id, share=share)
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "return_dict_in_generate": True,
            "output_logits": bool(sampling.logprobs),
        }
        if sampling.temperature > 0:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if sampling.beams > 1:
            kwargs.update(num_beams=sampling.beams, num_return_sequences=1, early_stopping=True)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        from transformers import LogitsProcessorList

        steps = _step_counter(sampling.max_tokens)
        processors = LogitsProcessorList([steps])
        if sampling.constraint is not None:
            from grtool.index.constraints import constraint_from_spec
            from grtool.index.decoding import DocidLogitsProcessor

            eos = _eos_ids(self.lm, self.tokenizer)  # a document constraint ends the output with one of them
            constraint = constraint_from_spec(sampling.constraint, self.tokenizer.backend_tokenizer, eos_ids=eos)
            processors.insert(0, DocidLogitsProcessor(constraint))
        kwargs["logits_processor"] = processors
        torch.manual_seed(sampling.seed)
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.lm.generate(**enc, **kwargs)
        latency_ms = (time.perf_counter() - started) * 1000  # the batch's; a row that stopped early was done earlier
        prompt_len = enc["input_ids"].shape[1]
        new_tokens = out.sequences[:, prompt_len:]
        eos = _eos_ids(self.lm, self.tokenizer)
        gens = []
        for row in range(len(ids)):
            ids = new_tokens[row].tolist()
            n, hit_eos = len(ids), False
            for j, t in enumerate(ids):
                if t in eos:
                    n, hit_eos = j + 1, True
                    break
            content_ids = ids[: n - 1] if hit_eos else ids[:n]
            text = self.tokenizer.decode(content_ids, skip_special_tokens=not _keeps_markers(sampling))
            finish = "stop" if hit_eos or n < sampling.max_tokens else "length"
            text, stopped = _cut_at_stop(text, sampling.stop)
            if stopped:
                finish = "stop"
            gen = Generation(
                text=text,
                finish_reason=finish,
                prompt_tokens=int(enc["attention_mask"][row].sum()),
                completion_tokens=n,
                latency_ms=steps.done_ms(n, started) if hit_eos else latency_ms,
            )
            if sampling.logprobs:
                gen.logprobs = self._token_logprobs(out.logits, row, ids[:n], sampling.logprobs)
            gens.append(gen)
        return gens

    def _token_logprobs(self, logits: tuple, row: int, ids: list[int], k: int) -> list[TokenLogprobs]:
        """Log-softmax of the raw logits at every step (what vLLM and OpenAI servers report), with the top k."""
        import torch

        out = []
        for step, token_id in enumerate(ids):
            lp = torch.log_softmax(logits[step][row].float(), dim=-1)
            values, alt_ids = torch.topk(lp, k)
            top: dict[str, float] = {}
            for v, a in zip(values.tolist(), alt_ids.tolist()):
                top.setdefault(self.tokenizer.decode([a]), v)
            out.append(TokenLogprobs(self.tokenizer.decode([token_id]), float(lp[token_id]), top))
        return out


def _with_adapter(lm, adapter: str):
    """The model with a LoRA adapter (peft) merged into its weights: inference then costs what the base costs."""
    check_adapter(adapter)
    try:
        from peft import PeftModel
    except ImportError as e:
        raise MissingDependency("--adapter", "peft", detail=e, extra="train") from None
    try:
        return PeftModel.from_pretrained(lm, adapter).merge_and_unload().eval()
    except Exception as e:  # noqa: BLE001  (an adapter made for another model: missing modules, wrong shapes)
        raise InputError(f"--adapter {adapter}: does not apply to this model ({_first_line(e)})") from None


def check_adapter(adapter: str | Path) -> None:
    """A LoRA adapter folder as `train --lora` writes it: adapter_config.json naming its method, whole weights."""
    import orjson

    from grtool.models import model_weights

    folder = Path(adapter)
    if not folder.is_dir():
        raise InputError(f"--adapter {adapter}: not a directory (the adapter folder `train --lora` writes, CKPT/adapter)")
    if not (folder / "adapter_config.json").is_file():
        raise InputError(f"--adapter {adapter}: not a LoRA adapter directory (no adapter_config.json)")
    try:
        config = orjson.loads((folder / "adapter_config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise InputError(f"--adapter {adapter}: adapter_config.json is not valid JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("peft_type"), str):
        raise InputError(f"--adapter {adapter}: adapter_config.json names no peft_type: not a peft adapter")
    if not any(f.name.startswith("adapter_model.") for f in folder.iterdir()):
        raise InputError(f"--adapter {adapter}: holds no adapter weights (adapter_model.safetensors)")
    model_weights(folder, "--adapter")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _step_counter(max_tokens: int):
    """A logits processor that changes nothing and reports each decoding step to the progress display
    (:func:`~grtool.log.activity_detail`): one Python call and a short string per step, against a forward pass."""
    from transformers import LogitsProcessor

    class StepCounter(LogitsProcessor):
        def __init__(self):
            self.steps = 0
            self.times: list[float] = []  # when each step's scores were ready (its token is picked right after)

        def __call__(self, input_ids, scores):
            self.steps += 1
            self.times.append(time.perf_counter())
            activity_detail(f"{self.steps} of at most {max_tokens} tokens")
            return scores

        def done_ms(self, tokens: int, started: float) -> float:
            """Milliseconds from ``started`` until a row's ``tokens``-th token was picked: its own latency, not the
            batch's, for a row that hit EOS while others went on."""
            at = self.times[min(tokens, len(self.times)) - 1] if tokens and self.times else time.perf_counter()
            return (at - started) * 1000

    return StepCounter()


def _keeps_markers(sampling: Sampling) -> bool:
    """Under a special-marker docid constraint the markers are special tokens that belong to the text."""
    return sampling.constraint is not None and sampling.constraint.get("markers") == "special"


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Stop strings end the text without being part of it (as on vLLM and OpenAI servers)."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _grouped_sdpa() -> str:
    """Name of an attention function that hands grouped key/value heads to SDPA as they are (``enable_gqa``).

    transformers repeats the key/value heads to the query heads' count whenever an attention mask is given, as it
    always is with padded batches: a copy of every layer's whole cache at every step, which was half of the CPU
    time of a decoding step (profiled on SmolLM2, 3 key/value heads for 9 query heads). torch's CPU kernel takes
    the mask and the groups together, with the same result (tested), 4x faster per call.
    """
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        shared = getattr(key, SHARED_PREFIX_ATTR, None)
        if shared is not None:
            return _attention_with_shared_prefix(query, key, value, shared, attention_mask, scaling), None
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            scale=scaling,
            is_causal=bool(query.shape[2] > 1 and attention_mask is None and causal),
            enable_gqa=query.shape[1] != key.shape[1],
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(GROUPED_SDPA, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)  # the masks plain sdpa gets
    return GROUPED_SDPA


GROUPED_SDPA = "grtool_grouped_sdpa"
SHARED_PREFIX_ATTR = "grtool_shared_prefix"  # on the keys a SharedPrefixLayer hands out: the prefix's (keys, values)


def _attention_with_shared_prefix(query, key, value, shared, attention_mask, scaling):
    """Attention over the shared prefix (one copy, batch 1) and each row's own keys, merged by their log-sum-exps.

    Every row sees the whole prefix, so the prefix part needs no mask: the queries of all rows and of every head
    of a group are stacked into one batch-1 call, which reads the prefix's keys and values once instead of once a
    row. The rows' own part takes the mask's columns after the prefix. The two softmaxes are combined exactly
    (``logaddexp``); only the order of the floating-point sums differs from one softmax over the whole row.
    """
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    prefix_keys, prefix_values = shared
    batch, heads, q_len, dim = query.shape
    groups = key.shape[1]
    per_group = heads // groups
    # [B, H, Q, d] -> [1, G, B*r*Q, d]: head h = g*r + i reads key/value head g
    stacked = query.reshape(batch, groups, per_group * q_len, dim).transpose(0, 1).reshape(1, groups, -1, dim)
    out_p, lse_p = flash(stacked, prefix_keys, prefix_values, scale=scaling)
    out_p = out_p.reshape(groups, batch, per_group * q_len, dim).transpose(0, 1).reshape(batch, heads, q_len, dim)
    lse_p = lse_p.reshape(groups, batch, per_group * q_len).transpose(0, 1).reshape(batch, heads, q_len)
    mask = blind = None
    if attention_mask is not None:
        own = attention_mask[..., prefix_keys.shape[2] :]
        mask = torch.zeros(own.shape, dtype=query.dtype).masked_fill_(~own, float("-inf")) if own.dtype == torch.bool else own
        blind = (mask == float("-inf")).all(-1)  # [B|1, 1, Q]: queries that see none of their row's own keys
    elif q_len > 1:  # no mask given: plain causal over the row's own keys, the last query at the last key
        own_len = key.shape[2]
        mask = torch.full((q_len, own_len), float("-inf"), dtype=query.dtype).triu_(own_len - q_len + 1)
    # the rows' own part: heads of a group share key/value head g, so fold them into the query axis
    out_s, lse_s = flash(
        query.reshape(batch, groups, per_group * q_len, dim),
        key,
        value,
        attn_mask=None if mask is None else _per_group_mask(mask, per_group),
        scale=scaling,
    )
    out_s = out_s.reshape(batch, heads, q_len, dim)
    lse_s = lse_s.reshape(batch, heads, q_len)
    if blind is not None and bool(blind.any()):
        # a query that sees none of its row's own keys (a padding position): the prefix alone, whatever SDPA made of it
        lse_s = lse_s.masked_fill(blind, float("-inf"))
        out_s = out_s.masked_fill(blind.unsqueeze(-1), 0.0)
    total = torch.logaddexp(lse_p, lse_s)
    weight_s = torch.exp(lse_s - total).unsqueeze(-1)
    out = out_p * torch.exp(lse_p - total).unsqueeze(-1) + out_s * weight_s
    return out.transpose(1, 2).contiguous()


def _per_group_mask(mask, per_group: int):
    """A [B|1, 1, Q, K] mask repeated for the ``per_group`` query heads folded into the query axis (Q -> r*Q)."""
    if mask.dim() == 2:
        mask = mask[None, None]
    if mask.shape[-2] == 1:
        return mask  # one query: the same row for every head of the group
    return mask.repeat(1, 1, per_group, 1)


class _SharedPrefix:
    """Keys and values of the prompt prefix that every request shares, computed once and reused by every batch.

    Stage prompts start with the same long system text and worked examples (~800 of ~880 tokens for triples),
    so most of the prefill is the same work in every row of every batch. The shared part is run through the
    model once; each batch then starts from a copy of its cache and computes only the rows' own tokens.
    Padding goes between the shared part and each row's own tokens: positions are counted from the attention
    mask, so every token keeps the position it has unpadded and greedy output is the same as without reuse.
    """

    MIN_TOKENS = 32  # below this the copies cost about what they save

    def __init__(self, lm):
        self.lm = lm
        self.ids: list[int] = []
        self.cache = None

    def shared_by(self, ids: list[list[int]]) -> "_SharedPrefix":
        """Make the cached prefix the longest one all ``ids`` share (kept when it still fits); returns self."""
        if self.ids and all(row[: len(self.ids)] == self.ids and len(row) > len(self.ids) for row in ids):
            return self
        shared = _common_prefix_length(ids)
        if shared < self.MIN_TOKENS:
            self.ids, self.cache = [], None
            return self
        import torch

        self.ids = list(ids[0][:shared])
        self.cache = _growing_cache(self.lm.config)
        with activity(f"encoding the {shared}-token prompt prefix every request shares (once)"), torch.inference_mode():
            self.lm(input_ids=torch.tensor([self.ids], device=self.lm.device), past_key_values=self.cache, use_cache=True)
        return self

    def batch_inputs(self, ids: list[list[int]], pad_id: int, share: bool = False) -> dict[str, Any]:
        """``generate`` inputs for one batch: left-padded rows, or the shared prefix, padding, then each row's own tokens.

        ``share``: the rows' cache points at the prefix's keys and values instead of a copy of them per row (the
        attention must be grouped-head SDPA, which reads them through :func:`_attention_with_shared_prefix`)."""
        import torch

        n = len(self.ids)
        tails = [row[n:] for row in ids]
        width = max(map(len, tails))
        input_ids = [self.ids + [pad_id] * (width - len(t)) + t for t in tails]
        mask = [[1] * n + [0] * (width - len(t)) + [1] * len(t) for t in tails]
        device = self.lm.device
        inputs: dict[str, Any] = {
            "input_ids": torch.tensor(input_ids, device=device),
            "attention_mask": torch.tensor(mask, device=device),
        }
        if self.cache is not None and share:
            cache = _shared_prefix_cache(self.lm.config, self.cache)  # the prefix read in place, never copied
        elif self.cache is not None:
            cache = copy.deepcopy(self.cache)  # generate appends to the cache it is given
            cache.batch_repeat_interleave(len(ids))
        else:
            cache = _growing_cache(self.lm.config)
        inputs["past_key_values"] = cache
        return inputs


def _growing_cache(config):
    """A DynamicCache whose full-attention layers append in place (see :func:`_growing_layer_class`)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    growing = _growing_layer_class()
    cache.layers = [growing() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _shared_prefix_cache(config, prefix_cache):
    """A cache for one batch whose full-attention layers start empty and hand out the prefix's keys and values
    (batch 1, computed once) alongside the rows' own: see :func:`_shared_prefix_layer_class`."""
    cache = _growing_cache(config)
    shared = _shared_prefix_layer_class()
    cache.layers = [shared(prefix.keys, prefix.values) if isinstance(layer, _growing_layer_class()) else copy.deepcopy(prefix) for layer, prefix in zip(cache.layers, prefix_cache.layers)]
    return cache


@functools.cache
def _shared_prefix_layer_class():
    """A growing layer that holds the rows' own keys and values and counts the shared prefix before them.

    Copying the ~800-token prefix into every row of a batch made attention a third of a CPU decoding step (8 rows,
    each reading its own copy of the same keys at every step). This layer keeps the one copy and attaches it to the
    keys it returns; the grouped-head attention reads it once for all rows."""

    class SharedPrefixLayer(_growing_layer_class()):
        def __init__(self, prefix_keys, prefix_values):
            super().__init__()
            self.prefix = (prefix_keys, prefix_values)

        def update(self, key_states, value_states, *args, **kwargs):
            keys, values = super().update(key_states, value_states, *args, **kwargs)
            setattr(keys, SHARED_PREFIX_ATTR, self.prefix)
            return keys, values

        def get_seq_length(self) -> int:
            return self.prefix[0].shape[-2] + super().get_seq_length()

    return SharedPrefixLayer


@functools.cache
def _growing_layer_class():
    """A DynamicLayer that writes new keys and values into spare room instead of concatenating.

    transformers' DynamicLayer concatenates at every step, a copy of the layer's whole cache per generated token:
    with a batch of 8 rows of ~900 tokens that was the largest cost of a CPU decoding step. This layer keeps a
    buffer with room for ``GROW`` more tokens and hands out views of its filled part. When anything replaced
    ``keys``/``values`` since the last update (a batch repeat, a crop), the next update adopts them.
    """
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        GROW = 256

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            buffers = getattr(self, "_room", None)
            if buffers is None or self.keys.data_ptr() != buffers[0].data_ptr() or self.keys.shape[0] != buffers[0].shape[0]:
                buffers = None  # keys/values were replaced from outside (or this is the first update): adopt them
            filled = self.keys.shape[-2] if self.keys.numel() else 0
            new = key_states.shape[-2]
            if buffers is None or filled + new > buffers[0].shape[-2]:
                room = filled + new + self.GROW
                grown = []
                for old, states in ((self.keys, key_states), (self.values, value_states)):
                    buffer = states.new_empty((*states.shape[:2], room, states.shape[-1]))
                    if filled:
                        buffer[:, :, :filled] = old
                    grown.append(buffer)
                buffers = self._room = tuple(grown)
            buffers[0][:, :, filled : filled + new] = key_states
            buffers[1][:, :, filled : filled + new] = value_states
            self.keys = buffers[0][:, :, : filled + new]
            self.values = buffers[1][:, :, : filled + new]
            return self.keys, self.values

    return GrowingLayer


def _common_prefix_length(ids: list[list[int]]) -> int:
    """Tokens every row starts with, leaving each row at least one token of its own (generate needs one)."""
    limit = min(len(row) for row in ids) - 1
    first = ids[0]
    for j in range(max(limit, 0)):
        token = first[j]
        if any(row[j] != token for row in ids):
            return j
    return max(limit, 0)
