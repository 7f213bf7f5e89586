"""`grtool chains` commands."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, TableInput, TableOutput, register
from grtool.cli.llm_options import LLMSettings, llm_options
from grtool.cli.shape import counts_text, moved_to_options
from grtool.cli.options import allows_empty, MaxEmptyShare, CannotAnswer, Json, NumShards, Out, Overwrite, ShardIndex, Split, check_cannot_answer, refuse_json_with_stdout, print_report
from grtool.docid import DOCID_END, DOCID_START

register(Group("chains", "Synthesize thought-retrieval chains from questions and gold triples."))


class Select(str, Enum):
    entropy = "entropy"
    first = "first"


class Unanswerable(str, Enum):
    keep = "keep"
    skip = "skip"


@allows_empty
@llm_options(temperature=0.7, max_tokens=512)
def synthesize(
    corpus: Annotated[str, typer.Argument(help="Questions: an ingest output directory, its questions/ stage, or '-' (JSON Lines on stdin).")],
    triples: Annotated[Path, typer.Option("--triples", metavar="PATH", help="Triples stage directory (from `grtool triples extract`), or a run directory holding triples/.")],
    out: Out,
    split: Split = None,
    candidates: Annotated[int, typer.Option("--candidates", "-n", min=1, help="Chains per question: one greedy, the rest sampled at --temperature (GReG: 5).")] = 5,
    select: Annotated[Select, typer.Option("--select", help="Which candidate is `selected`: entropy (lowest median word/entity entropy, needs logprobs) or first (the greedy one).")] = Select.entropy,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", min=1, max=20, help="Alternatives per token for the entropy (top-k).")] = 5,
    distractors: Annotated[int, typer.Option("--distractors", min=0, help="Triples from non-gold documents added to each prompt.")] = 0,
    constrain: Annotated[
        Optional[bool],
        typer.Option(
            "--constrain/--no-constrain",
            help="Citations can only be the triples offered to the model, either way round (decoding constraint; default on for transformers and vllm; with openai, pass it for a vLLM server: sent as a structured-output regex).",
        ),
    ] = None,
    unanswerable: Annotated[
        Unanswerable,
        typer.Option(
            "--unanswerable",
            help="Questions marked unanswerable (MuSiQue-full): keep = offer their context paragraphs' triples (no gold) and expect a chain ending in the cannot-answer sentence; skip = reject them (not answerable).",
        ),
    ] = Unanswerable.keep,
    prompt: Annotated[Optional[Path], typer.Option("--prompt", help="Instruction text replacing the built-in one.")] = None,
    few_shot: Annotated[Optional[Path], typer.Option("--few-shot", help="JSON Lines of {question, triples, chain} replacing the built-in examples (an empty file: zero-shot).")] = None,
    few_shot_corpus: Annotated[
        Optional[int],
        typer.Option(
            "--few-shot-corpus",
            min=1,
            help="K worked examples from the corpus's own questions and gold triples instead of the built-in ones (never the question asked); small models copy these far better.",
        ),
    ] = None,
    docid_start: Annotated[str, typer.Option("--docid-start", help="Marker written before each docid.")] = DOCID_START,
    docid_end: Annotated[str, typer.Option("--docid-end", help="Marker written after each docid.")] = DOCID_END,
    max_empty_share: MaxEmptyShare("empty candidate chains (the part is kept)") = 0.2,
    cannot_answer: CannotAnswer = None,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
    as_json: Json = False,
    llm: LLMSettings = None,
) -> None:
    r"""Write candidate reasoning chains for every question, citing its gold documents' triples.

    Each prompt offers the question's gold triples (plus --distractors others), numbered in a seeded shuffle;
    an unanswerable question (--unanswerable keep) is offered its context paragraphs' triples instead.
    Citations the model writes as \[head, relation, tail] are stored as marked docids, flipped ones flagged.
    Questions without gold documents or without triples for them are rejected with the reason, never dropped.
    Empty answers are never selected over non-empty ones; too many of them in a part (--max-empty-share) exit 1.

    Example: grtool chains synthesize out/2wiki --triples out/2wiki/triples --split train --out out/2wiki/chains --candidates 4 --select entropy
    """
    from grtool.docid import Markers, check_markers
    from grtool.chains.prompt import ChainPrompt
    from grtool.chains.synthesize import ChainSettings
    from grtool.chains.synthesize import run_summary
    from grtool.chains.synthesize import synthesize as run
    from grtool.models import DEFAULT_MODEL_NAME
    from grtool.log import log
    from grtool.store.coverage import check_triples_cover

    refuse_json_with_stdout(as_json, out)

    settings = ChainSettings(
        candidates=candidates,
        temperature=llm.temperature,
        top_p=llm.top_p,
        max_tokens=llm.max_tokens,
        select=select.value,
        top_logprobs=top_logprobs,
        distractors=distractors,
        seed=llm.seed,
        markers=check_markers(Markers(docid_start, docid_end)),
        constrain=_constrain(constrain, llm.backend),
        unanswerable=unanswerable.value,
    )
    cannot_answer = check_cannot_answer(cannot_answer)
    if candidates > 1 and llm.temperature == 0:
        log.warning("--temperature 0: the sampled candidates will mostly repeat the greedy one")
    check_triples_cover(triples, corpus)  # before the worked examples, which join them too
    chain_prompt = ChainPrompt.load(prompt, few_shot)
    if few_shot_corpus:
        chain_prompt = chain_prompt.with_corpus_examples(corpus, triples, few_shot_corpus, splits=tuple(split or ()))
    chain_prompt = chain_prompt.with_cannot_answer(cannot_answer)
    manifest, stats = run(
        corpus, str(triples), str(out), llm.make_backend, settings, chain_prompt,
        backend_name=llm.backend, model_name=llm.model or (DEFAULT_MODEL_NAME if llm.backend != "openai" else None),
        cache_dir=llm.cache_dir_for(out), overwrite=overwrite, num_shards=num_shards, shard_index=shard_index,
        max_empty_share=max_empty_share, splits=tuple(split or ()),
    )  # fmt: skip
    if manifest is None:  # --out -: the rows went to stdout, the rejects to stderr
        log.info("chains: written to stdout; cache %d hits, %d generated", stats.hits, stats.misses)
        return
    summary = run_summary(str(out), manifest, stats)
    if as_json:
        print_report(summary)
        return
    log.info(
        "chains: %s questions chained, %s rows, rejected: %s; %s docids (%s flipped, %s not offered); cache %d hits, %d generated",
        summary["questions_chained"], summary["rows"], counts_text(summary["rejected"]), summary["docids"],
        summary["docids_flipped"], summary["docids_not_offered"], summary["cache_hits"], summary["cache_generated"],
    )  # fmt: skip


def _synthesize_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    from grtool.cli.llm_options import backend_extras

    select = options.get("select", Select.entropy)
    entropy = [("entities", "--select entropy")] if select in (Select.entropy, "entropy") else []  # spaCy's entities
    return backend_extras(options) + entropy


register(
    Command(
        "chains synthesize",
        synthesize,
        cls=moved_to_options("--triples"),
        reads={"corpus": TableInput("questions"), "triples": TableInput("triples"), "prompt": PathKind.FILE, "few_shot": PathKind.FILE},
        writes={"out": TableOutput("chains"), "cache_dir": PathKind.DIRECTORY},
        extras=_synthesize_extras,
        report="grtool.chains.synthesize:ChainsReport",
    )
)  # `chains synthesize CORPUS TRIPLES` until the next release


def _constrain(asked: bool | None, backend: str) -> bool:
    """--constrain defaults to on where grtool runs the decoder. A server takes it as a structured-output regex
    (vLLM's ``structured_outputs``), which other OpenAI-compatible servers reject or ignore: asked for, not default."""
    if asked is None and backend == "openai":
        from grtool.log import log

        log.info("openai: citations are not constrained; pass --constrain when the server is vLLM (structured outputs)")
        return False
    return True if asked is None else asked


class Flip(str, Enum):
    auto = "auto"
    never = "never"
    always = "always"


@allows_empty
def gold_cmd(
    corpus: Annotated[str, typer.Argument(help="Questions: an ingest output directory, its questions/ stage, or '-' (JSON Lines on stdin).")],
    triples: Annotated[Path, typer.Option("--triples", metavar="PATH", help="Triples stage directory holding the gold documents' triples, or a run directory holding triples/.")],
    out: Out,
    split: Split = None,
    flip: Annotated[Flip, typer.Option("--flip", help="Docids written tail-first: auto = when the tail is known and the head is not; always; never.")] = Flip.auto,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
    as_json: Json = False,
) -> None:
    """Write one chain per question from its gold triples by rule, with no model (the teacher `gold`).

    Each step is a sentence from the triple's relation and the docid, in hop order (the dataset's own gold
    triples where the question carries them, 2Wiki's evidences; else the triple of each gold document that
    connects the question to the answer); the chain ends "So the answer is ...". The rows are the chains table's,
    for `filters apply` and `export sft`; a question it cannot write is rejected with the reason.

    Example: grtool chains gold out/2wiki --triples out/2wiki/triples --split train --out out/2wiki/chains-gold
    """
    from grtool.chains.gold import write_gold_chains
    from grtool.log import log

    refuse_json_with_stdout(as_json, out)
    manifest = write_gold_chains(corpus, str(triples), str(out), flip=flip.value, overwrite=overwrite, num_shards=num_shards,
                                 shard_index=shard_index, splits=tuple(split or ()))  # fmt: skip
    if manifest is None:  # --out -: the rows went to stdout, the rejects to stderr
        return
    counters = manifest.counters
    extra = counters.extra
    summary = {"out": str(out), "complete": manifest.complete, "questions": extra.get("questions", 0),
               "questions_chained": extra.get("questions_chained", 0), "rows": counters.out,
               "rejected": dict(counters.rejected), "docids": extra.get("docids", 0), "docids_flipped": extra.get("docids_flipped", 0)}  # fmt: skip
    if as_json:
        print_report(summary)
        return
    log.info("chains gold: %s questions chained, rejected: %s; %s docids (%s flipped)", summary["questions_chained"],
             counts_text(summary["rejected"]), summary["docids"], summary["docids_flipped"])  # fmt: skip


register(
    Command(
        "chains gold",
        gold_cmd,
        cls=moved_to_options("--triples"),
        reads={"corpus": TableInput("questions"), "triples": TableInput("triples")},
        writes={"out": TableOutput("chains")},
        report="grtool.chains.synthesize:ChainsReport",
    )
)  # `chains gold CORPUS TRIPLES` until the next release
