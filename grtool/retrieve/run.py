"""`grtool retrieve` from request to report: check the inputs, run the stage, score it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from grtool.errors import InputError
from grtool.extras import require
from grtool.index.base import Index
from grtool.log import log
from grtool.store.io import is_stdio


@dataclass(frozen=True)
class RetrieveRequest:
    corpus: str
    index: Path
    out: Path
    triples: Path | None = None
    datasets: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    limit: int | None = None
    markers: str = "special"
    few_shot: int | None = None
    cannot_answer: str | None = None
    samples: int = 1
    max_docids: int | None = None
    mode: str = "docids"
    beams: int = 1
    max_steps: int = 4
    adapter: Path | None = None
    max_empty_share: float = 0.2
    overwrite: bool = False
    num_shards: int | None = None
    shard_index: int | None = None


def triples_of_index(index: Index, given: Path | None) -> Path:
    """``--triples``, else the triples stage the index was built from (recorded in index.json)."""
    if given is not None:
        return given
    for entry in index.meta.get("inputs", []):
        path = entry.get("path")
        if path and path != "-" and Path(path).is_dir():
            return Path(path)
    raise InputError(f"{index.path}: the triples it was built from are not recorded or gone; pass --triples")


def model_tokenizer(model: str | None, adapter: Path | None):
    """The model's fast tokenizer (``tokenizers.Tokenizer``), loaded without the weights."""
    from transformers import AutoTokenizer

    from grtool.llm.models import resolve_model

    ref = resolve_model(model)
    source = adapter if adapter is not None and (Path(adapter) / "tokenizer.json").is_file() else ref.path
    try:
        return AutoTokenizer.from_pretrained(str(source)).backend_tokenizer, ref.name
    except (OSError, ValueError) as e:
        raise InputError(f"--model {model}: cannot load its tokenizer ({e})") from None


def _check_adapter(adapter: Path, tokenizer) -> None:
    """`train sft --lora` adds the markers to the base model and trains their embedding rows, which live in the
    merged checkpoint beside the adapter, not in the adapter: the base model with the adapter cannot write them."""
    from grtool.docid import DOCID_START

    checkpoint = adapter.resolve().parent
    if (checkpoint / "grtool.json").is_file() and tokenizer.token_to_id(DOCID_START) is None:
        raise InputError(
            f"--adapter {adapter}: trained with <docid_start>/<docid_end> added to the base model; their embedding rows "
            f"are in the merged checkpoint, not in the adapter: use --model {checkpoint}"
        )


def check_trained_for(mode: str, model: str | None, adapter: Path | None) -> None:
    """A model `train sft` made (its ``grtool.json`` beside the weights, or beside the adapter) knows one task:
    GMR pairs (data format ``gmr``) make a document generator for --mode gmr, chains a docid reasoner for
    --mode docids. The other mode would decode a model with a prompt it never saw: refused."""
    from grtool.train.data import GMR

    for where, folder in (("--model", Path(model) if model else None), ("--adapter", Path(adapter).resolve().parent if adapter else None)):
        record = folder / "grtool.json" if folder is not None else None
        if record is None or not record.is_file():
            continue
        try:
            fmt = (orjson.loads(record.read_bytes()).get("data") or {}).get("format")
        except (ValueError, OSError, AttributeError):
            continue  # not a record this check can read: the model is taken as it is
        if fmt is None or (fmt == GMR) == (mode == "gmr"):
            continue
        trained = "`export gmr` pairs" if fmt == GMR else f"chains ({fmt})"
        fix = "--mode gmr" if fmt == GMR else "--mode docids, or a model trained on `export gmr` pairs"
        raise InputError(f"{where} {model if where == '--model' else adapter}: trained on {trained} ({record}); --mode {mode} needs the other kind: use {fix}")


def _check_out(request: RetrieveRequest, llm) -> None:
    """--out before the model loads: never the index, the model, the adapter or a stage it reads; --overwrite
    only of a responses stage (the stage writer checks it again under its lock)."""
    if is_stdio(request.out):
        return
    from grtool.store.outputs import STAGE, check_replaceable, input_stage, refuse_output_among_inputs

    model = llm.model if llm.model and Path(llm.model).exists() else None
    refuse_output_among_inputs(
        request.out, inputs=[request.index, model, request.adapter, input_stage(request.corpus, "questions"), input_stage(request.triples, "triples")],
        holders=[request.corpus, request.triples],
    )
    if request.overwrite:
        check_replaceable(request.out, STAGE, table="responses")


def retrieve(request: RetrieveRequest, llm) -> dict[str, Any]:
    """Run the stage; the report the command prints (recall, hallucinations, docids per response, latency)."""
    from grtool.export.readers import DocidIndex
    from grtool.chains.corpus_examples import pick_examples
    from grtool.retrieve.prompt import RetrievePrompt
    from grtool.retrieve.stage import RetrieveSettings, Selection, index_fingerprint, run_retrieve

    if request.adapter is not None and not Path(request.adapter).is_dir():
        raise InputError(f"--adapter {request.adapter}: no such directory")
    if request.adapter is not None:  # peft merges it into the model
        require("train", "--adapter")
    if llm.backend == "openai":
        raise InputError("retrieve constrains decoding inside the model: use --backend transformers or vllm")
    if request.mode == "gmr" and llm.backend != "transformers":
        raise InputError(f"--mode gmr decodes whole documents with constrained beam search, which only --backend transformers runs (not {llm.backend})")
    if request.samples > 1 and llm.temperature == 0:  # greedy every time: N copies of one response
        raise InputError(f"--samples {request.samples} with --temperature 0: every sample would be the greedy response; give --temperature > 0 or --samples 1")
    check_trained_for(request.mode, llm.model, request.adapter)
    _check_out(request, llm)
    index = Index.open(request.index)
    wanted = "documents" if request.mode == "gmr" else "docids"
    if index.source != wanted:
        fix = "--source documents" if wanted == "documents" else "--source docids (the default)"
        raise InputError(f"{request.index}: an index of {index.source}, but --mode {request.mode} needs one of {wanted} (`grtool index build … {fix}`)")
    tokenizer, model_name = model_tokenizer(llm.model, request.adapter)
    if request.adapter is not None and request.markers == "special" and request.mode == "docids":
        _check_adapter(Path(request.adapter), tokenizer)
    from grtool.index.agreement import check_agreement

    # gmr writes no markers: only the vocabulary must agree (documents and DONE), as with brackets.
    check_agreement(index, tokenizer, llm.model or model_name, markers="brackets" if request.markers == "brackets" or request.mode == "gmr" else "special")
    selection = Selection.of(request.corpus, request.datasets, request.splits, request.limit)
    triples = triples_of_index(index, request.triples) if request.mode == "docids" else request.triples
    few_shot = request.few_shot if request.few_shot is not None else (3 if request.markers == "brackets" and request.mode == "docids" else 0)
    if request.mode == "gmr" and few_shot:
        raise InputError("--few-shot: --mode gmr sends the `export gmr` step input only (a model trained on those pairs)")
    examples = pick_examples(request.corpus, triples, few_shot) if few_shot and triples is not None else []
    if few_shot and len(examples) < few_shot + 1:
        log.warning("--few-shot %d: the corpus has only %d questions usable as examples", few_shot, len(examples))
    prompt = RetrievePrompt(request.markers, examples, few_shot, cannot_answer=request.cannot_answer)
    settings = RetrieveSettings(
        markers="documents" if request.mode == "gmr" else request.markers, mode=request.mode, samples=request.samples, temperature=llm.temperature, top_p=llm.top_p,
        seed=llm.seed, max_tokens=llm.max_tokens, max_docids=request.max_docids, beams=request.beams, max_steps=request.max_steps,
    )  # fmt: skip
    lookup = DocidIndex.build(triples) if triples is not None else None
    options = llm.backend_options()
    options["adapter"] = str(request.adapter) if request.adapter is not None else None

    def backend():
        from grtool.llm import make_backend

        return make_backend(llm.backend, llm.model, **options)

    params = {
        **settings.params(), "backend": llm.backend, "model": model_name, "adapter": options["adapter"],
        "prompt_sha256": prompt.sha256(), "index": str(request.index), "index_fingerprint": index_fingerprint(index),
        "datasets": list(request.datasets), "splits": list(request.splits), "limit": request.limit,
    }  # fmt: skip
    if request.cannot_answer:  # only when given: a manifest written before the option stays resumable
        params["cannot_answer"] = request.cannot_answer
    inputs = [str(selection.table.source), str(request.index)] + ([str(triples)] if triples is not None else [])
    run = run_retrieve(
        selection, prompt, index, lookup, request.out, backend, settings, model_name=model_name, params=params, inputs=inputs,
        cache_dir=llm.cache_dir_for(request.out), overwrite=request.overwrite, num_shards=request.num_shards,
        shard_index=request.shard_index, max_empty_share=request.max_empty_share,
    )  # fmt: skip
    return summarize(request, run.manifests[0], lookup)


def summarize(request: RetrieveRequest, manifest: dict[str, Any], lookup) -> dict[str, Any]:
    from grtool.evaluation.recall import evaluate_recall
    from grtool.export.readers import QuestionIndex
    from grtool.retrieve.stage import latency_percentiles

    counters = manifest.get("counters") or {}
    extra = counters.get("extra") or {}
    responses = int(counters.get("out", 0))
    report: dict[str, Any] = {
        "out": str(request.out),
        "responses": responses,
        "docids": int(extra.get("docids", 0)),
        "docids_per_response": extra.get("docids", 0) / responses if responses else 0.0,
        "hallucinated": int(extra.get("docids_hallucinated", 0)),
        "flipped": int(extra.get("docids_flipped", 0)),
        "malformed": int(extra.get("malformed", 0)),
        "too_long": int(extra.get("questions_too_long", 0)),  # rejected (_rejects/, reason too_long): no response
        "latency_ms": {"p50": None, "p95": None},
        "recall": None,
        "recall_note": None,
    }
    if is_stdio(request.out):
        report["recall_note"] = "the responses went to stdout; pipe them into `grtool eval recall -`"
        return report
    report["latency_ms"] = latency_percentiles(request.out)
    if not manifest.get("complete"):
        report["recall_note"] = "other tasks' parts are not done yet; run `grtool eval recall` on the directory when all tasks are"
        return report
    if lookup is None and request.mode == "gmr":
        lookup = _NoDocids()
    recall = evaluate_recall(request.out, QuestionIndex.build(request.corpus), lookup) if lookup is not None else None
    if recall is None or recall["responses"] == 0:
        report["recall_note"] = "no selected question has gold documents (or no triples to score with)"
    else:
        report["recall"] = recall
    return report


class _NoDocids:
    """gmr rows name their documents, so recall needs no triples (nothing is looked up)."""

    def resolve_many(self, keys):
        return [(frozenset(), False) for _ in keys]
