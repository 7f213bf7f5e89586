"""`grtool retrieve` from request to report: check the inputs, run the stage, score it."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from grtool.errors import InputError
from grtool.evaluation.gold_coverage import coverage_warning, gold_coverage
from grtool.evaluation.overlap import pinned_questions
from grtool.extras import require
from grtool.index.base import Index
from grtool.log import log
from grtool.models import resolve_model
from grtool.store.coverage import check_triples_cover
from grtool.store.io import is_stdio
from grtool.store.records import Counters, Manifest
import msgspec
from grtool.records import Report


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
    few_shot_from: str | None = None  # a corpus/run directory or a split of the corpus (default: train)
    system: str | None = None
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


SAMPLES_TEMPERATURE = 0.7  # --samples N > 1 without --temperature


def sampling_temperature(samples: int, given: float | None) -> float:
    """--temperature as given (one sample at T > 0 is sampled, seeded by --seed); unset: greedy for one sample,
    0.7 for several."""
    if given is not None:
        return given
    return SAMPLES_TEMPERATURE if samples > 1 else 0.0


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
    """The fast tokenizer decoding uses (``tokenizers.Tokenizer``): the model's, loaded without the weights. An
    adapter is merged into the model's weights and decodes with the model's tokenizer, so a tokenizer saved in the
    adapter's folder must be the same vocabulary (else the checks would pass on one tokenizer and decoding use
    another)."""
    ref = resolve_model(model)
    tokenizer = _load_tokenizer(ref.path, "--model", model)
    if adapter is not None and (Path(adapter) / "tokenizer.json").is_file():
        from grtool.index.agreement import vocabulary_mismatch

        own = _load_tokenizer(adapter, "--adapter", adapter)
        differs = vocabulary_mismatch(own, tokenizer, names=("adapter's", "model's")) or vocabulary_mismatch(tokenizer, own, names=("model's", "adapter's"))
        if differs:
            raise InputError(
                f"--adapter {adapter}: its tokenizer is not the model's ({differs}); decoding uses "
                f"the model's: give the model the adapter was trained with (its merged checkpoint: --model {Path(adapter).resolve().parent})"
            )
    return tokenizer, ref.name


def _load_tokenizer(source: str | Path, flag: str, given: object):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(source)).backend_tokenizer
    except Exception as e:  # noqa: BLE001  (transformers' advice, e.g. to install sentencepiece, would mislead)
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise InputError(f"{flag} {given}: cannot load its tokenizer ({first})") from None


def check_adapter_base(adapter: Path, model: str | None) -> None:
    """An adapter `train --lora` made applies to the base model it was trained on (compared by the weights digest
    the checkpoint records for a local folder, else by name), and never to its own merged checkpoint, which holds
    it already (merging it again doubles its change). An adapter without a grtool checkpoint beside it is peft's
    to judge when it loads."""
    from grtool.vocab.provenance import read_checkpoint

    checkpoint = Path(adapter).resolve().parent
    record = read_checkpoint(checkpoint)
    if record is None:
        return
    ref = resolve_model(model)
    if Path(ref.path).resolve() == checkpoint:
        raise InputError(
            f"--adapter {adapter}: --model {model} is its own merged checkpoint, which holds the adapter already; "
            f"give --model {checkpoint} without --adapter (or the base model {record.base_model.name} with it)"
        )
    base, given = record.base_model.name, ref.name
    same = base.rpartition("@")[2] == given.rpartition("@")[2] if "@" in base and "@" in given else base == given
    if not same:
        raise InputError(f"--adapter {adapter}: trained on base model {base} ({checkpoint / 'grtool.json'}), not on --model {given}; give --model {record.base_model.path}")


def _check_adapter(adapter: Path, tokenizer) -> None:
    """`train sft --lora` adds the markers to the base model and trains their embedding rows, which live in the
    merged checkpoint beside the adapter, not in the adapter: the base model with the adapter cannot write them."""
    from grtool.docid import DOCID_START

    checkpoint = adapter.resolve().parent
    if (checkpoint / "grtool.json").is_file() and tokenizer.token_to_id(DOCID_START) is None:
        raise InputError(
            f"--adapter {adapter}: trained with <docid_start>/<docid_end> added to the base model; their embedding rows are in the merged checkpoint, not in the adapter: use --model {checkpoint}"
        )


def checkpoint_dir(model: str | None, adapter: Path | None) -> Path | None:
    """Where a `train` checkpoint's grtool.json would be: beside the adapter's folder, else the model folder."""
    return Path(adapter).resolve().parent if adapter is not None else (Path(model) if model and Path(model).is_dir() else None)


def trained_by_grtool(model: str | None, adapter: Path | None) -> bool:
    """The model is a checkpoint `grtool train` wrote (its grtool.json is there)."""
    from grtool.vocab.provenance import CHECKPOINT_RECORD

    folder = checkpoint_dir(model, adapter)
    return folder is not None and (folder / CHECKPOINT_RECORD).is_file()


def check_flips(index: Index, model: str | None, adapter: Path | None, triples: Path | None) -> None:
    """A model that learned tail-first docids (its checkpoint's grtool.json says so) needs an index that holds
    them (``--flips``): otherwise every flipped docid it starts is cut off by the constraint, and recall is lower
    without a word. The other way round is harmless: the flips are there, unused."""
    from grtool.vocab.provenance import checkpoint_flips

    checkpoint = checkpoint_dir(model, adapter)
    learned = checkpoint_flips(checkpoint)
    if learned and not index.flips:
        raise InputError(
            f"{index.path}: built without --flips, but the model {checkpoint} was trained on flipped (tail-first) docids "
            f"(its grtool.json): rebuild the index with them: `grtool index build {triples or 'TRIPLES'} --tokenizer {checkpoint} --flips --out …`"
        )
    if learned is False and index.flips:
        log.info("%s holds flipped docids; the model %s was trained without them (harmless: they go unused)", index.path, checkpoint)


def check_trained_for(mode: str, model: str | None, adapter: Path | None) -> None:
    """A model `train sft` made (its ``grtool.json`` beside the weights, or beside the adapter) knows one task:
    GMR pairs (data format ``gmr``) make a document generator for --mode gmr, chains a docid reasoner for
    --mode docids. The other mode would decode a model with a prompt it never saw: refused."""
    from grtool.vocab.provenance import CHECKPOINT_RECORD, read_checkpoint
    from grtool.vocab.gmr import GMR

    for where, folder in (("--model", Path(model) if model else None), ("--adapter", Path(adapter).resolve().parent if adapter else None)):
        checkpoint = read_checkpoint(folder)  # a damaged record: exit 1 naming its field, not "taken as it is"
        if checkpoint is None:
            continue
        fmt, record = checkpoint.data.format, folder / CHECKPOINT_RECORD
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
        request.out,
        inputs=[request.index, model, request.adapter, input_stage(request.corpus, "questions"), input_stage(request.triples, "triples")],
        holders=[request.corpus, request.triples],
    )
    if request.overwrite:
        check_replaceable(request.out, STAGE, table="responses")


def retrieve(request: RetrieveRequest, llm) -> dict[str, Any]:
    """Run the stage; the report the command prints (recall, hallucinations, docids per response, latency)."""
    from grtool.docid.lookup import use_trimmable_arrow_pool
    from grtool.vocab.readers import DocidIndex
    from grtool.retrieve.stage import RetrieveSettings, index_fingerprint, run_retrieve
    from grtool.store.questions import Selection

    use_trimmable_arrow_pool()  # the pages the checks below decode, not held for the whole run beside the model

    if request.mode == "gmr" and request.system:
        raise InputError("--system: --mode gmr sends the `export gmr` step input only, which has no system prompt")
    if request.adapter is not None and not Path(request.adapter).is_dir():
        raise InputError(f"--adapter {request.adapter}: no such directory")
    if request.adapter is not None:  # peft merges it into the model
        from grtool.llm.transformers_backend import check_adapter

        require("train", "--adapter")
        check_adapter(request.adapter)
        check_adapter_base(Path(request.adapter), llm.model)
    if llm.backend == "openai":
        raise InputError("retrieve constrains decoding inside the model: use --backend transformers or vllm")
    if request.mode == "gmr" and llm.backend != "transformers":
        raise InputError(f"--mode gmr decodes whole documents with constrained beam search, which only --backend transformers runs (not {llm.backend})")
    temperature = sampling_temperature(request.samples, llm.temperature)
    if request.samples > 1 and temperature == 0:  # greedy every time: N copies of one response
        raise InputError(f"--samples {request.samples} with --temperature 0: every sample would be the greedy response; give --temperature > 0 or --samples 1")
    check_trained_for(request.mode, llm.model, request.adapter)
    _check_out(request, llm)
    index = Index.open(request.index)
    wanted = "documents" if request.mode == "gmr" else "docids"
    if index.source != wanted:
        fix = "--source documents" if wanted == "documents" else "--source docids (the default)"
        raise InputError(f"{request.index}: an index of {index.source}, but --mode {request.mode} needs one of {wanted} (`grtool index build … {fix}`)")
    selection = Selection.of(request.corpus, request.datasets, request.splits, request.limit)  # before the tokenizer loads (seconds)
    tokenizer, model_name = model_tokenizer(llm.model, request.adapter)
    if request.adapter is not None and request.markers == "special" and request.mode == "docids":
        _check_adapter(Path(request.adapter), tokenizer)
    from grtool.index.agreement import check_agreement

    # gmr writes no markers: only the vocabulary must agree (documents and DONE), as with brackets.
    check_agreement(index, tokenizer, llm.model or model_name, markers="brackets" if request.markers == "brackets" or request.mode == "gmr" else "special")
    triples = triples_of_index(index, request.triples) if request.mode == "docids" else request.triples
    if request.mode == "docids":
        check_flips(index, llm.model, request.adapter, triples)
    check_triples_cover(triples, request.corpus)
    asked = selection.qids()
    coverage = gold_coverage(request.corpus, index, asked)  # before the model runs: what no response can retrieve
    if warning := coverage_warning(coverage):
        log.warning("%s", warning)
    prompt = retrieve_prompt(request, triples, asked, trained=trained_by_grtool(llm.model, request.adapter))
    settings = RetrieveSettings(
        markers="documents" if request.mode == "gmr" else request.markers, mode=request.mode, samples=request.samples, temperature=temperature, top_p=llm.top_p,
        seed=llm.seed, max_tokens=llm.max_tokens, max_docids=request.max_docids, beams=request.beams, max_steps=request.max_steps,
    )  # fmt: skip
    lookup = DocidIndex.build(triples) if triples is not None else None
    from grtool.docid.lookup import release_build_memory

    # The checks above decoded whole Parquet row groups (docids.parquet's samples, the triples' few-shot
    # documents: ~100 MB at a million triples); Arrow's pool would keep those pages beside the model all run.
    release_build_memory()
    options = llm.backend_options()
    options["adapter"] = str(request.adapter) if request.adapter is not None else None

    def backend():
        from grtool.llm import make_backend

        return make_backend(llm.backend, llm.model, **options)

    params = {
        **settings.params(), "backend": llm.backend, "model": model_name, "adapter": options["adapter"],
        "system": request.system, "few_shot_from": few_shot_record(request, prompt), "prompt_sha256": prompt.sha256(), "index": str(request.index), "index_fingerprint": index_fingerprint(index),
        "datasets": list(request.datasets), "splits": list(request.splits), "limit": request.limit,
    }  # fmt: skip
    if request.cannot_answer:  # only when given: a manifest written before the option stays resumable
        params["cannot_answer"] = request.cannot_answer
    # A local checkpoint's training questions, pinned (null: a folder grtool did not train): scoring reads them
    # here, whatever becomes of the folder. Named models (the embedded one, hub ids) record none.
    if (checkpoint := checkpoint_dir(llm.model, request.adapter)) is not None:
        params["trained_questions"] = pinned_questions(checkpoint)
    inputs = [str(selection.table.source), str(request.index)] + ([str(triples)] if triples is not None else [])
    run = run_retrieve(
        selection, prompt, index, lookup, request.out, backend, settings, model_name=model_name, params=params, inputs=inputs,
        cache_dir=llm.cache_dir_for(request.out), overwrite=request.overwrite, num_shards=request.num_shards,
        shard_index=request.shard_index, max_empty_share=request.max_empty_share,
    )  # fmt: skip
    return {**summarize(request, run.manifests[0], lookup), "coverage": coverage}


FEW_SHOT_SPLIT = "train"  # --few-shot-from by default: the corpus's training questions


def default_few_shot(markers: str, mode: str, trained: bool) -> int:
    """--few-shot when not given: worked examples help an off-the-shelf model write bracket docids; a model
    `grtool train` fitted was trained on the bare instruction (export sft has no examples), so it gets that."""
    return 3 if markers == "brackets" and mode == "docids" and not trained else 0


def retrieve_prompt(request: RetrieveRequest, triples: Path | None, evaluated: Collection[str] = (), trained: bool = False):
    """The prompt of every question: ``--system`` (as `export sft --system` puts it), ``--few-shot`` worked turns,
    then the SFT instruction. The worked turns come from ``--few-shot-from`` (a directory, or a split of the
    corpus: train by default) and never from the ``evaluated`` questions (qids): a test question's gold docids
    must not be in the prompt of another. ``trained``: the model is a grtool checkpoint (no examples by default)."""
    from grtool.chains.corpus_examples import pick_examples
    from grtool.retrieve.prompt import RetrievePrompt

    few_shot = request.few_shot if request.few_shot is not None else default_few_shot(request.markers, request.mode, trained)
    if request.mode == "gmr" and few_shot:
        raise InputError("--few-shot: --mode gmr sends the `export gmr` step input only (a model trained on those pairs)")
    examples = []
    if few_shot and triples is not None:
        source, split = few_shot_source(request)
        examples = pick_examples(source, triples, few_shot, split=split, exclude=frozenset(evaluated), spare=0)
        where = f"--few-shot-from {request.few_shot_from or FEW_SHOT_SPLIT}" + ("" if request.few_shot_from else " (the default)")
        if not examples:
            raise InputError(
                f"{where}: no question usable as a worked example (answerable, an answer, ≥ 2 gold documents that all have triples, "
                "and not among the questions being answered); pass --few-shot-from DIR|SPLIT with other questions, --split to answer others, or --few-shot 0"
            )
        if len(examples) < few_shot:
            log.warning("--few-shot %d: %s has only %d questions usable as examples", few_shot, where, len(examples))
    return RetrievePrompt(request.markers, examples, few_shot, system=request.system or None, cannot_answer=request.cannot_answer)


def few_shot_source(request: RetrieveRequest) -> tuple[str, str | None]:
    """(questions to draw from, split or None): an existing directory as given, else a split of the corpus."""
    given = request.few_shot_from or FEW_SHOT_SPLIT
    if request.few_shot_from and Path(given).exists():
        return given, None
    if request.few_shot_from and ("/" in given or given.startswith(".")):
        raise InputError(f"--few-shot-from {given}: no such directory")
    return request.corpus, given


def few_shot_record(request: RetrieveRequest, prompt) -> dict[str, Any] | None:
    """What the manifest says of the worked examples: where they came from and which questions."""
    if not prompt.k:
        return None
    source, split = few_shot_source(request)
    return {"source": str(source), "split": split, "qids": [e.qid for e in prompt.examples]}


def summarize(request: RetrieveRequest, manifest: Manifest | None, lookup) -> dict[str, Any]:
    from grtool.evaluation.recall import evaluate_recall
    from grtool.vocab.readers import QuestionIndex
    from grtool.retrieve.stage import latency_percentiles

    counters = manifest.counters if manifest is not None else Counters()  # None: the responses went to stdout
    extra = counters.extra
    responses = counters.out
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
    if manifest is None or not manifest.complete:
        report["recall_note"] = "other tasks' parts are not done yet; run `grtool eval recall` on the directory when all tasks are"
        return report
    scorable = lookup is not None or request.mode == "gmr"  # gmr rows name their documents: nothing to look up
    recall = evaluate_recall(request.out, QuestionIndex.build(request.corpus), lookup) if scorable else None
    if recall is None or recall["responses"] == 0:
        report["recall_note"] = "no selected question has gold documents (or no triples to score with)"
    else:
        report["recall"] = recall
    return report


class RetrieveReport(Report, kw_only=True):
    """``retrieve --json``: :func:`summarize` (``--method bm25`` gives no docid counts, note or coverage)."""

    out: str
    responses: int
    docids: int | msgspec.UnsetType = msgspec.UNSET
    docids_per_response: float | msgspec.UnsetType = msgspec.UNSET
    hallucinated: int | msgspec.UnsetType = msgspec.UNSET
    flipped: int | msgspec.UnsetType = msgspec.UNSET
    malformed: int | msgspec.UnsetType = msgspec.UNSET
    too_long: int | msgspec.UnsetType = msgspec.UNSET
    latency_ms: dict[str, float | None]
    recall: dict[str, Any] | None
    recall_note: str | None | msgspec.UnsetType = msgspec.UNSET
    coverage: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
