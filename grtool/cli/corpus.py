"""`grtool corpus` commands: ingest, merge, stats (``overlap`` attaches from corpus_overlap.py)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, RunOutput, TableInput, register
from grtool.cli.options import allows_empty, Json, Overwrite, RunOut, Plot, RowsPerPart, Strict, plot_extras, refuse_json_with_stdout, print_report

register(Group("corpus", "Ingest, merge and describe the question/document corpora."))


class DatasetChoice(str, Enum):
    auto = "auto"
    hotpotqa = "hotpotqa"
    twowiki = "2wikimultihopqa"
    musique = "musique"
    morehopqa = "morehopqa"
    hotpotqa_wiki = "hotpotqa-wiki"
    generic = "generic"
    inline = "inline"


def _report_summary(title: str, report: dict, as_json: bool) -> None:
    """The summary as a table on stderr, or as one JSON object on stdout (--json)."""
    if as_json:
        print_report(report)
    else:
        _print_summary(title, report)


def _print_summary(title: str, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    from grtool.log import stage_summary

    t = Table(title=title, show_header=False)
    t.add_column("what")
    t.add_column("n", justify="right")
    for key in ("questions", "documents", "paragraphs", "documents_merged"):
        if key in report:
            t.add_row(key.replace("_", " "), f"{report[key]:,}")
    for name, n in sorted(report.get("questions_by_dataset", {}).items()):
        t.add_row(f"  questions read: {name}", f"{n:,}")
    for said, n in sorted(report.get("splits_read_as", {}).items()):
        t.add_row(f"  split {escape(said)}", f"{n:,}")
    if report.get("empty_inputs"):
        t.add_row("empty inputs (no records)", f"{len(report['empty_inputs']):,}")
    for reason, n in sorted(report.get("rejected", {}).items()):
        t.add_row(f"rejected: {reason}", f"{n:,}")
    stage_summary.print(t)
    if report.get("detected"):
        from grtool.corpus.columns import variant_hints

        read = Table(title="inputs read as", show_header=True)
        for col in ("input", "dataset", "records", "split", "by", "keys not read"):
            read.add_column(col)
        hints: list[str] = []
        for entry in report["detected"]:
            where = entry["path"] + (f" ({entry['files']:,} files)" if entry.get("files") else "")
            split = entry.get("split") or "-"  # "-": documents only (or a manifest written before splits were shown)
            records = entry["records"] + (f" ({entry['layout']})" if entry.get("layout") else "")
            unread = entry.get("unread") or []
            hints += [h for h in variant_hints(unread) if h not in hints]
            read.add_row(where, entry["dataset"], records, f"[yellow]{split}[/]" if split == "unknown" else split, entry["by"], f"[yellow]{', '.join(unread)}[/]" if unread else "-")
        stage_summary.print(read)
        if any(entry.get("unread") for entry in report["detected"]):
            stage_summary.print(
                "keys not read: kept as given in each question's meta column; a document's are not kept" + (f". To read them: --columns {','.join(hints)}" if hints else ""), highlight=False
            )


@allows_empty
def ingest_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="Release files or directories (a directory is read recursively).")],
    out: RunOut,
    dataset: Annotated[
        DatasetChoice,
        typer.Option(
            "--dataset",
            help="Dataset of every input; auto detects it per file from keys only one release format has. Needed for "
            "an ambiguous file (a list of {title, text} documents, such as HippoRAG's corpus files: its documents are "
            "tagged with this dataset); refused for records of another dataset. generic: your own questions and "
            "documents files (docs/data-formats.md).",
        ),
    ] = DatasetChoice.auto,
    split: Annotated[Optional[str], typer.Option("--split", help="Split name for every input (default: train/dev/test from each file name).")] = None,
    strict: Strict = False,
    overwrite: Overwrite = False,
    rows_per_part: RowsPerPart = None,
    allow_empty: Annotated[bool, typer.Option("--allow-empty", help="Accept an empty corpus: inputs without a single record (else exit 2) and no row written (else exit 1).")] = False,
    columns: Annotated[
        Optional[str],
        typer.Option(
            "--columns",
            metavar="TARGET=SOURCE,...",
            help="Read your files' keys under the names a layout reads, e.g. question=query,answer=golden_answers "
            "(targets: qid, question, answer, aliases, split, type, answerable, gold_doc_ids, gold_titles, "
            "paragraphs, title, text, is_supporting; the last three inside paragraphs too). A target no layout "
            "reads or a source key no record holds is an error (exit 2).",
        ),
    ] = None,
    allow_rejects: Annotated[
        bool, typer.Option("--allow-rejects", help="Write the corpus without the questions whose gold title names several documents (else exit 1, nothing written); they go to questions/_rejects.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Read dataset release files into OUT/documents and OUT/questions.

    Inputs: HotpotQA, 2WikiMultihopQA, MuSiQue, MoreHopQA files (the releases or their Hugging Face layouts), the
    HotpotQA Wikipedia dump, the generic layout: a questions file ({qid, question, answer, gold_doc_ids or
    gold_titles}) with a documents file ({id and/or title, text}), or the inline layout ({question, answer, aliases,
    paragraphs: [{title, text, is_supporting}]}); JSON arrays or JSON Lines, plain, gzip, bzip2 or xz, or tar
    archives of them, Parquet files and Arrow files (a Dataset.save_to_disk folder), recognized from the bytes.
    Keys a layout does not read are named in the summary. Every layout: docs/data-formats.md.

    Each input file's dataset is detected from its first record, by keys that only one release format has; a
    file that could be several (a list of {title, text} documents) needs --dataset (exit 2 otherwise). The
    summary and the manifests list what each file was read as.

    Each distinct paragraph is one document (doc_id: a hash of the normalized title and text) listing every
    dataset it appears in.

    Records that do not fit go to _rejects with the reason (--strict: fatal). A killed run resumes when the
    same command is run again.

    Example: grtool corpus ingest hotpot_dev_distractor_v1.json musique_ans_v1.0_dev.jsonl --out out/corpus

    Example: grtool corpus ingest questions.jsonl documents.jsonl --dataset generic --out out/mine

    Example: grtool corpus ingest flashrag_dev.jsonl --columns answer=golden_answers --out out/mine
    """
    from grtool.log import log
    from grtool.corpus.datasets import given_split
    from grtool.corpus.ingest import ingest

    refuse_json_with_stdout(as_json, out)
    split = given_split(split, "--split") if split is not None else None
    report = ingest(
        inputs, str(out), dataset=dataset.value, split=split, strict=strict, overwrite=overwrite, rows_per_part=rows_per_part, allow_empty=allow_empty, columns=columns, allow_rejects=allow_rejects
    )
    if str(out) != "-":
        _report_summary(f"ingested into {out}", report.as_dict(), as_json)
    if report.empty_inputs and report.resumed:  # a fresh run warned while reading
        for name in report.empty_inputs:
            log.warning("%s: empty input (no records)", name)
    if report.rejected:
        log.warning("%d records rejected (see _rejects/ of the stage directories)", sum(report.rejected.values()))


register(Command("corpus ingest", ingest_cmd, reads={"inputs": PathKind.FILE}, writes={"out": RunOutput("documents", "questions")}, report="grtool.corpus.ingest:IngestSummary"))


@allows_empty
def merge_cmd(
    inputs: Annotated[list[Path], typer.Argument(help="Ingested run directories (each holding documents/ and questions/).")],
    out: RunOut,
    overwrite: Overwrite = False,
    rows_per_part: RowsPerPart = None,
    as_json: Json = False,
) -> None:
    """Union of ingested corpora: documents deduplicated by doc_id (their datasets united), questions
    concatenated (a qid seen twice is rejected).

    Example: grtool corpus merge out/2wiki out/morehopqa --out out/2wiki+morehopqa
    """
    from grtool.corpus.merge import merge

    refuse_json_with_stdout(as_json, out)
    report = merge(inputs, str(out), overwrite=overwrite, rows_per_part=rows_per_part)
    if str(out) != "-":
        _report_summary(f"merged into {out}", report, as_json)


register(
    Command("corpus merge", merge_cmd, reads={"inputs": TableInput("documents", kind=PathKind.RUN)}, writes={"out": RunOutput("documents", "questions")}, report="grtool.corpus.merge:MergeSummary")
)


def stats_cmd(
    directory: Annotated[Path, typer.Argument(help="A run directory holding questions/ (and documents/).")],
    as_json: Json = False,
    plot: Plot = None,
    triples: Annotated[
        Optional[Path], typer.Option("--triples", help="Also the gold coverage: the share of gold documents with a docid in this triples stage (or run directory holding triples/).")
    ] = None,
    index: Annotated[Optional[Path], typer.Option("--index", help="Also the gold coverage: the share of gold documents with a docid in this index directory.")] = None,
) -> None:
    """Per dataset and split: questions, documents, gold documents per question (mean/min/max), hop
    distribution and answerable share.

    With --triples or --index, also the gold coverage per dataset and split: the gold documents that hold at least
    one docid there, and the questions none of whose gold documents does (recall 0 by construction); `coverage`
    in --json. Below 100% a warning says what to do.

    Example: grtool corpus stats out/corpus --plot out/corpus/stats.png

    Example: grtool corpus stats out/corpus --triples out/triples
    """

    from grtool.log import console, log
    from grtool.corpus.stats import corpus_stats, plot_stats, stats_table
    from grtool.errors import InputError
    from grtool.evaluation.gold_coverage import coverage_table, coverage_warning, gold_coverage
    from grtool.store.outputs import input_stage, refuse_overlapping_outputs
    from grtool.store.partloop import claim_file

    if triples is not None and index is not None:
        raise InputError("--triples and --index both give the docids the coverage counts: give one")
    read = [input_stage(directory, "questions"), input_stage(directory, "documents"), input_stage(triples, "triples"), index]
    refuse_overlapping_outputs([("--plot", plot)], inputs=read, holders=[directory, triples])
    with claim_file(plot, "--plot", inputs=read) as plot_file:
        stats = corpus_stats(directory)
        if triples is not None or index is not None:
            from grtool.index.base import Index

            stats["coverage"] = gold_coverage(directory, triples if triples is not None else Index.open(index))
        if plot_file is not None:
            log.info("wrote %s", plot_file.write_with(lambda tmp: plot_stats(stats, tmp)))
    if as_json:
        print_report(stats, indent=True)
    else:
        console.print(stats_table(stats))
        if "coverage" in stats:
            console.print(coverage_table(stats["coverage"]))
    if "coverage" in stats and (warning := coverage_warning(stats["coverage"])):
        log.warning("%s", warning)


register(
    Command(
        "corpus stats",
        stats_cmd,
        reads={"directory": PathKind.RUN, "triples": TableInput("triples"), "index": PathKind.DIRECTORY},
        writes={"plot": PathKind.REPORT},
        extras=plot_extras,
        report="grtool.corpus.stats:StatsReport",
    )
)


def split_cmd(
    corpus: Annotated[Path, typer.Argument(help="An ingested (or merged) run directory holding questions/ and documents/.")],
    out: RunOut,
    ratios: Annotated[str, typer.Option("--ratios", help="Share of the questions in each split, e.g. 0.8,0.1,0.1 (summing to 1).")],
    names: Annotated[Optional[str], typer.Option("--names", help="The splits' names, one per ratio (default: train,dev,test; two ratios: train,dev).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Another seed gives another split of the same questions.")] = 0,
    resplit: Annotated[bool, typer.Option("--resplit", help="Replace the splits the questions already have (else such a corpus is refused, exit 2).")] = False,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """Give every question a split by ratio, for data that came without splits; write a new corpus to OUT.

    A question's split comes from a hash of its qid and --seed alone: it keeps its split when questions are added,
    and the same corpus splits the same way every time. OUT/questions holds every question with its new split,
    OUT/documents the documents as they were. The summary gives the questions per split.

    Example: grtool corpus split out/mine/corpus --ratios 0.8,0.1,0.1 --out out/mine/split
    """
    from rich.table import Table

    from grtool.log import stage_summary
    from grtool.corpus.split import parse_ratios, split_corpus

    refuse_json_with_stdout(as_json, out)
    if str(out) == "-":
        from grtool.errors import InputError

        raise InputError("--out -: corpus split writes a run directory (questions/ and documents/), not JSON Lines")
    shares, split_names = parse_ratios(ratios, names)
    report = split_corpus(corpus, out, ratios=shares, names=split_names, seed=seed, resplit=resplit, overwrite=overwrite)
    if as_json:
        print_report(report)
        return
    t = Table(title=f"questions per split in {out}", show_header=False)
    t.add_column("split")
    t.add_column("questions", justify="right")
    for name in split_names:
        t.add_row(name, f"{report['by_split'].get(name, 0):,}")
    t.add_row("all", f"{report['questions']:,}")
    stage_summary.print(t)


register(
    Command(
        "corpus split",
        split_cmd,
        reads={"corpus": TableInput("questions", "documents", kind=PathKind.RUN)},
        writes={"out": RunOutput("documents", "questions")},
        report="grtool.corpus.split:SplitSummary",
    )
)
