"""`grtool retrieve`: answer questions with a model under hybrid docid decoding."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, Optional

import typer

from grtool.cli.commands import Command, PathKind, TableInput, TableOutput, register
from grtool.cli.llm_options import LLMSettings, llm_options
from grtool.cli.options import allows_empty, MaxEmptyShare, CannotAnswer, Json, NumShards, Out, Overwrite, ShardIndex, Split, check_cannot_answer, print_report


class MarkerMode(str, Enum):
    special = "special"
    brackets = "brackets"


class Mode(str, Enum):
    docids = "docids"
    gmr = "gmr"


class Method(str, Enum):
    model = "model"
    bm25 = "bm25"


@allows_empty
@llm_options(needed=lambda options: options.get("method") != Method.bm25, temperature=None, max_tokens=512)
def retrieve_cmd(
    corpus: Annotated[str, typer.Argument(help="Corpus run directory (holding questions/) or its questions stage.")],
    out: Out,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory (`grtool index build`) built with the model's tokenizer (--method model).")] = None,
    method: Annotated[
        Method, typer.Option("--method", help="model: a model answers under constrained decoding; bm25: the lexical baseline (bm25s over the corpus's documents, no model, no index).")
    ] = Method.model,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="--method bm25: documents per question (default: |gold| + 1, the paper's protocol for one-shot retrievers).")] = None,
    triples: Annotated[Optional[Path], typer.Option("--triples", help="Triples stage for recall and flips (default: the one the index was built from).")] = None,
    dataset: Annotated[Optional[list[str]], typer.Option("--dataset", help="Only questions of this dataset (repeatable).")] = None,
    split: Split = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="The first N selected questions.")] = None,
    markers: Annotated[
        MarkerMode, typer.Option("--markers", help="special: the two marker tokens of a model trained with them; brackets: \\[head, relation, tail], for off-the-shelf models.")
    ] = MarkerMode.special,
    few_shot: Annotated[
        Optional[int],
        typer.Option(
            "--few-shot",
            min=0,
            help="Worked examples before the question: questions of --few-shot-from with their gold triples (default: 3 with brackets for a model `grtool train` did not write, else 0).",
        ),
    ] = None,
    few_shot_from: Annotated[
        Optional[str], typer.Option("--few-shot-from", help="Where --few-shot examples come from: a corpus/run directory or a split of CORPUS (default: train); never a question being answered.")
    ] = None,
    system: Annotated[
        Optional[str], typer.Option("--system", help="System prompt before the question (the text given to `export sft --system` / `train --system`, so the model sees what it learned).")
    ] = None,
    samples: Annotated[
        int,
        typer.Option(
            "--samples",
            min=1,
            help="Responses per question (KTO sampling), sampled at --temperature (default 0.7 when N > 1) with seeds --seed, --seed+1, ...; one sample is greedy unless --temperature > 0 is given.",
        ),
    ] = 1,
    max_docids: Annotated[Optional[int], typer.Option("--max-docids", min=1, help="Open no new docid after this many.")] = None,
    mode: Annotated[Mode, typer.Option("--mode", help="docids: hybrid decoding of triples; gmr: one whole document per step from a --source documents index, until DONE.")] = Mode.docids,
    beams: Annotated[int, typer.Option("--beams", min=1, max=256, help="Constrained beam search width, 1 to 256 (transformers only; gmr usually 4).")] = 1,
    max_steps: Annotated[int, typer.Option("--max-steps", min=1, help="gmr: most documents per question.")] = 4,
    cannot_answer: CannotAnswer = None,
    adapter: Annotated[Optional[Path], typer.Option("--adapter", help="LoRA adapter directory to apply to --model (needs peft).")] = None,
    max_empty_share: MaxEmptyShare("empty responses") = 0.2,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
    as_json: Json = False,
    llm: LLMSettings = None,
) -> None:
    """Generate responses to questions: free text, and between docid markers only docids the index holds.

    Writes one row per question and sample (qid, sample, text, docids, flipped, doc_ids, n_docids, malformed,
    tokens, latency_ms, finish_reason, model, markers, mode); `eval recall` and `export kto` read the directory.
    The summary gives recall per dataset (as `eval recall`), hallucinated docids (0 under the constraint), docids
    per response and latency p50/p95. Before the model runs, the share of the selected questions' gold documents
    that hold a docid in the index is counted (`coverage` in --json); below 100% a warning names what no response
    can retrieve.

    With --method bm25 no model runs: bm25s ranks the corpus's documents (title and text; English stopwords, no
    stemmer, Lucene BM25 with k1 1.5, b 0.75) and each row holds the top |gold| + 1 (or --top-k) in rank order, mode bm25.

    Example: grtool retrieve out/run --index out/run/index --model out/ckpt/sft --out out/run/responses --samples 4

    Example: grtool retrieve out/run --method bm25 --split dev --out out/run/retrieve/bm25
    """

    if method == Method.bm25:
        model_only = {"--index": index, "--model": llm.model, "--adapter": adapter, "--few-shot": few_shot, "--few-shot-from": few_shot_from, "--system": system,
                      "--samples": samples != 1, "--max-docids": max_docids, "--mode": mode != Mode.docids, "--beams": beams != 1,
                      "--markers": markers != MarkerMode.special, "--cannot-answer": cannot_answer, "--triples": triples}  # fmt: skip
        given = [flag for flag, value in model_only.items() if value]
        if given:
            raise typer.BadParameter(f"{', '.join(given)}: options of --method model; BM25 ranks the corpus's documents without a model", param_hint="--method")
        return _bm25(corpus, out, top_k, tuple(dataset or ()), tuple(split or ()), limit, overwrite, num_shards, shard_index, as_json)
    if index is None:
        raise typer.BadParameter("--index is needed with --method model (the index the model's docids are decoded from)", param_hint="--index")
    if top_k is not None:
        raise typer.BadParameter("--top-k is for --method bm25 (a model decides how many documents it names)", param_hint="--top-k")
    from grtool.retrieve.run import RetrieveRequest, retrieve

    report = retrieve(
        RetrieveRequest(
            corpus=corpus, index=index, out=out, triples=triples, datasets=tuple(dataset or ()), splits=tuple(split or ()),
            limit=limit, markers=markers.value, few_shot=few_shot, few_shot_from=few_shot_from, system=system, cannot_answer=check_cannot_answer(cannot_answer), samples=samples, max_docids=max_docids, mode=mode.value,
            beams=beams, max_steps=max_steps, adapter=adapter, max_empty_share=max_empty_share, overwrite=overwrite,
            num_shards=num_shards, shard_index=shard_index,
        ),
        llm,
    )  # fmt: skip
    if as_json:
        print_report(report)
        return
    from grtool.cli.evaluate import print_recall
    from grtool.log import console

    if report.get("recall") is not None:
        print_recall(report["recall"])
    else:
        console.print(f"[yellow]recall not computed:[/] {report['recall_note']}", highlight=False)
    latency = report["latency_ms"]
    console.print(
        f"[green]retrieve[/] {report['out']}: {report['responses']:,} responses, {report['docids']:,} docids "
        f"({report['docids_per_response']:.2f} per response, {report['hallucinated']} hallucinated, {report['flipped']} flipped, "
        f"{report['malformed']} malformed); latency per query p50 {latency['p50']} ms, p95 {latency['p95']} ms",
        highlight=False,
    )
    if report["too_long"]:
        console.print(
            f"[yellow]too long for the model's context:[/] {report['too_long']:,} question(s) not answered "
            f"(rejected with reason too_long{'' if report['out'] == '-' else ', see ' + report['out'] + '/_rejects/'})",
            highlight=False,
        )


def _bm25(corpus: str, out: Path, top_k: int | None, datasets: tuple[str, ...], splits: tuple[str, ...],
          limit: int | None, overwrite: bool, num_shards: int | None, shard_index: int | None, as_json: bool) -> None:  # fmt: skip
    """`retrieve --method bm25`: the stage, then recall as `eval recall` prints it (no triples needed)."""

    from grtool.cli.evaluate import print_recall
    from grtool.evaluation.recall import evaluate_recall
    from grtool.log import console
    from grtool.retrieve.bm25 import run_bm25
    from grtool.retrieve.stage import latency_percentiles
    from grtool.store.io import is_stdio
    from grtool.vocab.readers import QuestionIndex

    if is_stdio(out):
        raise typer.BadParameter("--method bm25 writes a responses directory (`eval recall` reads it), not stdout", param_hint="--out")
    manifest = run_bm25(corpus, out, datasets=datasets, splits=splits, limit=limit, top_k=top_k, overwrite=overwrite,
                        num_shards=num_shards, shard_index=shard_index)  # fmt: skip
    report: dict[str, Any] = {"out": str(out), "responses": manifest.counters.out, "latency_ms": latency_percentiles(out), "recall": None}
    if manifest.complete:
        recall = evaluate_recall(out, QuestionIndex.build(corpus), None)
        report["recall"] = recall if recall["responses"] else None
    if as_json:
        print_report(report)
        return
    if report["recall"] is not None:
        print_recall(report["recall"])
    latency = report["latency_ms"]
    console.print(f"[green]retrieve --method bm25[/] {out}: {report['responses']:,} responses; search per query p50 {latency['p50']} ms, p95 {latency['p95']} ms", highlight=False)


def _retrieve_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    from grtool.cli.llm_options import backend_extras

    if options.get("method") == Method.bm25:
        return [("bm25", "--method bm25")]
    return backend_extras(options) + ([("train", "--adapter")] if options.get("adapter") else [])  # peft


register(
    Command(
        "retrieve",
        retrieve_cmd,
        reads={"corpus": TableInput("questions"), "index": PathKind.DIRECTORY, "triples": TableInput("triples"), "adapter": PathKind.DIRECTORY},
        writes={"out": TableOutput("responses"), "cache_dir": PathKind.DIRECTORY},
        extras=_retrieve_extras,
        report="grtool.retrieve.run:RetrieveReport",
    )
)
