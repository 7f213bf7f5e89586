"""`grtool triples` commands."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, RunOutput, TableInput, register
from grtool.cli.llm_options import LLMSettings, backend_extras, llm_options
from grtool.cli.options import allows_empty, Json, NumShards, Out, Overwrite, Plot, ShardIndex, Split, out_path, plot_extras, print_report
from grtool.docid import DOCID_END, DOCID_START


class CollisionView(str, Enum):
    own = "own"
    transitive = "transitive"


class Grounding(str, Enum):
    strict = "strict"
    loose = "loose"
    off = "off"


register(Group("triples", "Extract knowledge triples (docids) from documents with an LLM."))


@allows_empty
@llm_options(max_tokens=1024)
def extract_command(
    corpus: Annotated[str, typer.Argument(help="Ingest output directory, its documents/ stage directory, or '-' (JSON Lines).")],
    out: Out,
    prompt: Annotated[Optional[Path], typer.Option("--prompt", help="Text file with the system prompt (default: the packaged one).")] = None,
    few_shot: Annotated[
        Optional[Path], typer.Option("--few-shot", help="JSON or JSONL file of examples: objects with title, text and triples (lists of three strings); an empty list = zero-shot.")
    ] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", min=1, help="Only the first N documents of the corpus.")] = None,
    questions: Annotated[
        Optional[int],
        typer.Option(
            "--questions",
            min=1,
            help="Only the documents of the first N questions (of --split when given): their gold "
            "documents, and an unanswerable question's context paragraphs. A small set to try on a CPU; CORPUS must hold questions/.",
        ),
    ] = None,
    split: Split = None,
    structured: Annotated[
        Optional[bool],
        typer.Option("--structured/--no-structured", help="Constrain output to the triples JSON schema (default: on for vllm and openai; transformers cannot)."),
    ] = None,
    docid_start: Annotated[str, typer.Option("--docid-start", help="Marker before each rendered docid.")] = DOCID_START,
    docid_end: Annotated[str, typer.Option("--docid-end", help="Marker after each rendered docid.")] = DOCID_END,
    max_empty_share: Annotated[float, typer.Option("--max-empty-share", min=0.0, max=1.0, help="Exit 1 when a shard has a larger share of documents without triples.")] = 0.2,
    grounding: Annotated[
        Grounding,
        typer.Option(
            "--grounding",
            help="Drop triples whose head or tail the document does not hold. Tokens: NFKC, lowercase, accents and punctuation "
            "removed, stopwords ignored; a token also matches a document word that differs only by up to 3 trailing characters "
            "(the shorter ≥4 long: Russia/Russian). strict: every content token of the head and of the tail is in the title+text; "
            "loose: at least half of each side's, and at least one; off: no check. Self-loops and the prompt examples' "
            "entities absent from the document are dropped in every mode.",
        ),
    ] = Grounding.strict,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, help="Documents read and sent per generate call (rows are written per chunk; progress moves per request).")] = 2048,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
    as_json: Json = False,
    llm: LLMSettings = None,  # type: ignore[assignment]
) -> None:
    """Summarize every document into knowledge triples with an LLM; write OUT/triples and OUT/llm_calls.

    One request per document. Outputs are parsed whatever their shape (JSON, line lists, tables, truncated
    JSON); each triple becomes a docid string. Re-running resumes; answered requests come from the cache.

    Example: grtool triples extract out/hotpot --out out/hotpot --backend vllm --model meta-llama/Llama-3.1-8B-Instruct
    """
    import msgspec

    from grtool.log import stage_summary
    from grtool.docid import Markers, check_markers
    from grtool.models import DEFAULT_MODEL_NAME
    from grtool.store.io import InputTable
    from grtool.triples.extract import ExtractConfig, extract
    from grtool.store.records import Counters
    from grtool.triples.grounding import drop_shares
    from grtool.triples.prompt import TRIPLES_SCHEMA, load_prompt

    check_markers(Markers(docid_start, docid_end))
    chosen = _chosen_questions(corpus, questions, split, limit)
    documents = InputTable.open(corpus, "documents")
    grounding = Grounding(grounding).value
    spec = load_prompt(prompt, few_shot)
    if structured is None:
        structured = llm.backend in ("vllm", "openai")
    sampling = llm.sampling(json_schema=TRIPLES_SCHEMA if structured else None)
    model_name = llm.model or (DEFAULT_MODEL_NAME if llm.backend != "openai" else None)
    params = {
        **llm.identity(model_name),
        "sampling": sampling.as_dict(),
        "prompt_sha256": spec.sha256(),
        "docid_markers": [docid_start, docid_end],
        "limit": limit,
        "grounding": grounding,
        **({"questions": chosen[0]} if chosen else {}),
    }
    report = extract(
        documents,
        out,
        llm.make_backend,
        sampling,
        spec,
        params=params,
        config=ExtractConfig(docid_start, docid_end, limit, max_empty_share, chunk_size, grounding, chosen[1] if chosen else None),
        cache_dir=llm.cache_dir_for(out),
        num_shards=num_shards,
        shard_index=shard_index,
        overwrite=overwrite,
    )
    counters = report.manifest.counters if report.manifest is not None else None  # None: the triples went to stdout
    c = msgspec.to_builtins(counters) if counters is not None else {}  # the JSON form, as --json prints it
    extra = c.get("extra", {})
    shares = drop_shares(counters or Counters())
    if as_json:
        print_report({
            "triples": c.get("out", 0), "documents": extra.get("documents", 0), "grounding": grounding, "dropped": shares,
            "parts_done": report.parts_done, "parts_skipped": report.parts_skipped, "counters": c, "this_run": report.counters,
        }, indent=True)  # fmt: skip
    if c:
        dropped = ", ".join(f"{r} {v['dropped']} ({v['share']:.1%})" for r, v in shares.items())
        stage_summary.print(
            f"triples: {c.get('out', 0)} from {extra.get('documents', 0)} documents "
            f"({extra.get('documents_without_triples', 0)} without triples, {extra.get('truncated_outputs', 0)} truncated); "
            f"dropped ({grounding} grounding): {dropped}; "
            f"this run: {len(report.parts_done)} parts done, {len(report.parts_skipped)} already done, "
            f"cache hits {report.counters.get('cache_hits', 0)}, misses {report.counters.get('cache_misses', 0)}",
            highlight=False,
        )


def _chosen_questions(corpus: str, count: int | None, split: list[str] | None, limit: int | None):
    """``--questions``/``--split``: (the selection as recorded in the manifest, the documents it needs), or None."""
    if count is None and not split:
        return None
    from hashlib import sha256

    from grtool.errors import InputError
    from grtool.log import log
    from grtool.store.io import is_stdio
    from grtool.store.questions import SplitSelection
    from grtool.triples.extract import question_documents

    if limit is not None:
        raise InputError("--limit takes the first documents, --questions/--split the documents of questions: give one of them")
    if is_stdio(corpus):
        raise InputError("--questions/--split read the corpus's questions: CORPUS must be a run directory holding questions/, not -")
    selection = SplitSelection.of(split, corpus)
    qids, doc_ids = question_documents(corpus, count or 2**62, selection.splits)
    log.info("%d questions%s: %d documents to extract", len(qids), f" of {', '.join(selection.splits)}" if selection else "", len(doc_ids))
    record = {"count": count, "split": list(selection.splits), "selected": len(qids), "qids_sha256": sha256("\n".join(qids).encode("utf-8")).hexdigest()}
    return record, doc_ids


register(
    Command(
        "triples extract",
        extract_command,
        reads={"corpus": TableInput("documents"), "prompt": PathKind.FILE, "few_shot": PathKind.FILE},
        writes={"out": RunOutput("triples", "llm_calls"), "cache_dir": PathKind.DIRECTORY},
        extras=backend_extras,
        report="grtool.triples.extract:ExtractSummary",
    )
)


def collisions_command(
    triples: Annotated[Path, typer.Argument(help="Triples stage directory, or the run directory holding triples/.")],
    corpus: Annotated[Optional[Path], typer.Option("--corpus", help="Documents stage (or ingest output) for per-dataset shares (default: found from the triples manifest).")] = None,
    top: Annotated[int, typer.Option("--top", min=0, help="How many of the most colliding triples to list.")] = 20,
    view: Annotated[
        CollisionView,
        typer.Option(
            "--view",
            help="Which documents a dataset's row counts: own = those it brought (a paragraph shared by several datasets counts for each); transitive = every document its questions can reach in a merged corpus, through datasets joined to it by shared documents or MoreHopQA's source dataset, transitively.",
        ),
    ] = CollisionView.own,
    as_json: Json = False,
    plot: Plot = None,
) -> None:
    """Share of distinct triples found in ≥2 and ≥3 documents, overall and per dataset, and the worst offenders.

    With --view transitive, MoreHopQA's row after `corpus merge` with 2Wiki counts 2Wiki's documents too.

    Example: grtool triples collisions out/hotpot --json --plot collisions.png
    """
    from rich.table import Table

    from grtool.log import console
    from grtool.store.outputs import input_stage, refuse_overlapping_outputs
    from grtool.store.partloop import claim_file
    from grtool.triples.collisions import collision_stats, plot_docs_per_triple

    read = [input_stage(triples, "triples"), input_stage(corpus, "documents")]
    refuse_overlapping_outputs([("--plot", plot)], inputs=read, holders=[triples, corpus])
    with claim_file(plot, "--plot", inputs=read) as plot_file:
        report = collision_stats(triples, corpus, top, view.value)
        if plot_file is not None:
            plot_file.write_with(lambda tmp: plot_docs_per_triple(report, tmp))
    if as_json:
        print_report(report, indent=True)
        return
    table = Table(title=f"triple collisions in {report['triples']} (per dataset: {report['view']} documents)")
    for col in ("scope", "documents of", "distinct triples", "in ≥2 docs", "in ≥3 docs"):
        table.add_column(col, justify="left" if col in ("scope", "documents of") else "right")
    rows = [("all", report), *sorted(report["per_dataset"].items())]
    for name, r in rows:
        reach = "all" if name == "all" else ", ".join(report["reaches"][name])
        table.add_row(name, reach, f"{r['distinct_triples']:,}", f"{r['share_in_2plus_docs']:.2%}", f"{r['share_in_3plus_docs']:.2%}")
    console.print(table)
    dropped = ", ".join(f"{r} {v['dropped']} ({v['share']:.1%})" for r, v in report["dropped"].items())
    console.print(f"dropped before these triples (of kept + dropped): {dropped}", highlight=False)
    if report["corpus"] is None:
        console.print("no documents table found: per-dataset shares need --corpus", highlight=False)
    if report["top_colliding"]:
        worst = Table(title="most colliding triples")
        worst.add_column("documents", justify="right")
        worst.add_column("docid")
        for item in report["top_colliding"]:
            worst.add_row(str(item["documents"]), item["docid"])
        console.print(worst)


register(
    Command(
        "triples collisions",
        collisions_command,
        reads={"triples": TableInput("triples"), "corpus": TableInput("documents")},
        writes={"plot": PathKind.REPORT},
        extras=plot_extras,
        report="grtool.triples.collisions:CollisionsReport",
    )
)


@allows_empty
def evidence_command(
    corpus: Annotated[Path, typer.Argument(help="Ingest (or merge) output holding questions/ and documents/ of 2WikiMultihopQA.")],
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, metavar="DIR", help="Run directory to write: its triples/ stage.")],
    docid_start: Annotated[str, typer.Option("--docid-start", help="Marker before each rendered docid.")] = DOCID_START,
    docid_end: Annotated[str, typer.Option("--docid-end", help="Marker after each rendered docid.")] = DOCID_END,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """Docids without a model: the dataset's own gold triples (2WikiMultihopQA's evidences) as OUT/triples.

    Each question's evidences [subject, relation, object] become triples of its gold document titled like the
    subject. Rejected with the reason: an evidence that is not three strings, a part that cannot live inside a
    docid, a subject that names no gold document of the question. A triple two questions share is one row
    (merged). Only documents that some question's evidence names get triples; the Hugging Face copies' evidences
    (parallel lists) are not read.

    Example: grtool triples evidence out/2wiki --out out/2wiki-run
    """
    import msgspec

    from grtool.log import stage_summary
    from grtool.docid import Markers, check_markers
    from grtool.store.records import load_manifest
    from grtool.triples.evidence import write_evidence_stage

    if str(out) == "-":
        from grtool.errors import InputError

        raise InputError("--out -: triples evidence writes a run directory (its triples/ stage); name one")
    markers = Markers(docid_start, docid_end)
    check_markers(markers)
    write_evidence_stage(corpus, out / "triples", markers=markers, overwrite=overwrite)
    c = load_manifest(out / "triples").counters
    if as_json:
        print_report({"triples": c.out, "counters": msgspec.to_builtins(c)})  # the counters as JSON
        return
    rejected = ", ".join(f"{reason} {n}" for reason, n in sorted(c.rejected.items())) or "none"
    stage_summary.print(
        f"triples: {c.out} from {c.in_} evidences of {c.extra.get('questions', 0)} questions "
        f"({c.extra.get('questions_without_evidences', 0)} without evidences); merged {c.merged}; rejected: {rejected}",
        highlight=False,
    )


register(
    Command(
        "triples evidence",
        evidence_command,
        reads={"corpus": TableInput("questions", "documents", kind=PathKind.RUN)},
        writes={"out": RunOutput("triples")},
        report="grtool.triples.evidence:EvidenceReport",
    )
)
