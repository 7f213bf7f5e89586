"""`grtool export` commands."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from grtool.cli.commands import Command, FilesOutput, Group, PathKind, TableInput, register
from grtool.cli.options import allows_empty, CannotAnswer, Json, Split, check_cannot_answer, refuse_json_with_stdout, print_report

register(Group("export", "Export training data for SFT, KTO and GMR-style trainers."))


class SftFormat(str, Enum):
    alpaca = "llamafactory-alpaca"
    sharegpt = "llamafactory-sharegpt"
    trl = "trl-messages"


class KtoFormat(str, Enum):
    llamafactory = "llamafactory"
    trl = "trl"


class Desirable(str, Enum):
    exact = "exact"
    all_gold = "all-gold"


class Markers(str, Enum):
    special = "special"
    brackets = "brackets"


OutFile = Annotated[Path, typer.Option("--out", "-o", metavar="FILE", help="File to write ('-' = JSON Lines on stdout).")]
Corpus = Annotated[Path, typer.Option("--corpus", help="Corpus run directory (holding questions/), or its questions stage.")]
Triples = Annotated[Path, typer.Option("--triples", help="Triples stage directory (or a run directory holding triples/).")]
System = Annotated[Optional[str], typer.Option("--system", help="System prompt added to every example.")]
MarkersOpt = Annotated[Markers, typer.Option("--markers", help="Docid markers in prompt and chain: the special tokens, or square brackets for models without them.")]


@allows_empty
def sft_cmd(
    filtered: Annotated[Path, typer.Argument(help="Filtered chains stage directory ('-' = JSON Lines on stdin).")],
    corpus: Corpus,
    out: OutFile,
    split: Split = None,
    fmt: Annotated[SftFormat, typer.Option("--format", help="Trainer format.")] = SftFormat.sharegpt,
    system: System = None,
    markers: MarkersOpt = Markers.special,
    cannot_answer: CannotAnswer = None,
    max_per_dataset: Annotated[Optional[int], typer.Option("--max-per-dataset", min=0, help="At most N training examples per dataset (a seeded random sample).")] = None,
    dev_share: Annotated[float, typer.Option("--dev-share", min=0.0, max=0.99, help="Share of questions (by qid hash) written to <out>_dev.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="Shuffle seed.")] = 0,
    all_candidates: Annotated[
        bool, typer.Option("--all-candidates/--no-all-candidates", help="Export every chain (of a filtered stage: every passing candidate), not only each question's kept (selected) one.")
    ] = False,
    no_thought: Annotated[
        bool, typer.Option("--no-thought", help="The answer turn holds the chain's docids and its closing sentence only, without the thought sentences (the w/o Thought ablation).")
    ] = False,
    as_json: Json = False,
) -> None:
    """Turn filtered chains into an SFT dataset: the question in an instruction, the chain as the answer.

    LLaMA-Factory formats write a JSON array and add its entry to dataset_info.json beside it; trl-messages writes JSON Lines of {"messages": ...}. Train/dev are split by a hash of the qid, rows shuffled by --seed, training rows capped per dataset. Counts per dataset go to stderr.

    Example: grtool export sft out/filtered --corpus out/corpus --split train --out data/thinkgr_sft.json --dev-share 0.02 --max-per-dataset 100000
    """
    refuse_json_with_stdout(as_json, out)
    from rich.table import Table

    from grtool.log import stage_summary
    from grtool.export.sft import SftOptions, export_sft

    opts = SftOptions(fmt.value, system, markers.value, max_per_dataset, dev_share, seed, all_candidates, check_cannot_answer(cannot_answer), no_thought,
                      splits=tuple(split or ()))  # fmt: skip
    result = export_sft(filtered, corpus, out, opts)
    table = Table(title="SFT export")
    for col in ("dataset", "chains", "train", "dev", "capped"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for name, c in sorted(result.per_dataset.items()):
        table.add_row(name, str(c.chains), str(c.train), str(c.dev), str(c.capped))
    stage_summary.print(table)
    skipped = f"{result.rows_in} chains read; skipped: {result.not_selected} not selected, {result.unknown_qid} unknown qid, {result.empty_chain} empty"
    if split:
        skipped += f", {result.outside_split} outside --split"
    if no_thought:
        skipped += f", {result.broken_chain} with markers that do not pair up"
    stage_summary.print(skipped + (f" (e.g. {', '.join(result.unknown_examples)})" if result.unknown_examples else ""), highlight=False)
    for split, path in result.files.items():
        if path != "-":
            stage_summary.print(f"{split}: {path}", highlight=False)
    if result.dataset_info:
        stage_summary.print(f"dataset_info: {result.dataset_info}", highlight=False)
    if as_json:
        print_report(result.as_dict())


def dev_file(out: str, options: Mapping[str, Any]) -> list[str]:
    """The dev split's file `export sft --dev-share` writes beside --out (as the export names its files)."""
    from grtool.export.sft import sft_files

    try:
        share = float(options.get("dev_share") or 0)
    except (TypeError, ValueError):  # refused as an option value, in the option's words
        return []
    return [str(path) for split, path in sft_files(out, share).items() if split == "dev"]


register(
    Command("export sft", sft_cmd, reads={"filtered": TableInput("chains"), "corpus": TableInput("questions")}, writes={"out": FilesOutput(beside=dev_file)}, report="grtool.export.sft:SftReport")
)


@allows_empty
def kto_cmd(
    responses: Annotated[Path, typer.Argument(help='A `grtool retrieve` output directory, or JSON Lines of {"qid": ..., "response": ...} ("-" = stdin).')],
    corpus: Corpus,
    triples: Triples,
    out: OutFile,
    split: Split = None,
    tau: Annotated[float, typer.Option("--tau", min=0.0, max=1.0, help="Responses with recall below tau are undesirable.")] = 0.5,
    fmt: Annotated[KtoFormat, typer.Option("--format", help="Trainer format.")] = KtoFormat.llamafactory,
    system: System = None,
    markers: MarkersOpt = Markers.special,
    cannot_answer: CannotAnswer = None,
    desirable: Annotated[Desirable, typer.Option("--desirable", help="Desirable: exactly the gold documents (exact), or every gold document, extras allowed (all-gold).")] = Desirable.exact,
    as_json: Json = False,
) -> None:
    """Label sampled responses for KTO by the documents they retrieve.

    Desirable when a response retrieves exactly the gold documents (--desirable all-gold: every gold document, extra documents allowed), undesirable when its recall is below tau, dropped in between (recall exactly tau is dropped). Prints the class counts and the desirable_weight / undesirable_weight (TRL KTOConfig) that balance them; exits 1 when either class is empty.

    Example: grtool export kto samples.jsonl --corpus out/corpus --triples out/triples --split train --tau 0.5 --out data/thinkgr_kto.json
    """
    refuse_json_with_stdout(as_json, out)
    from rich.table import Table

    from grtool.log import stage_summary
    from grtool.export.kto import export_kto

    result = export_kto(responses, corpus, triples, out, tau=tau, fmt=fmt.value, system=system, markers=markers.value, desirable=desirable.value, cannot_answer=check_cannot_answer(cannot_answer),
                        splits=tuple(split or ()))  # fmt: skip
    summary = result.as_dict()
    table = Table(title=f"KTO labels (--desirable {desirable.value}, tau = {tau})")
    for col in ("dataset", "desirable", "undesirable", "dropped"):
        table.add_column(col, justify="left" if col == "dataset" else "right")
    for name, c in summary["per_dataset"].items():
        table.add_row(name, str(c["desirable"]), str(c["undesirable"]), str(c["dropped"]))
    table.add_row("all", str(result.desirable), str(result.undesirable), str(result.dropped), style="bold")
    stage_summary.print(table)
    stage_summary.print(f"rule: {summary['rule']}", highlight=False)
    stage_summary.print(
        f"weights: desirable_weight={summary['desirable_weight']} undesirable_weight={summary['undesirable_weight']}; "
        f"skipped: {result.skipped.unknown_qid} unknown qid, {result.skipped.no_gold} without gold, "
        f"{result.skipped.incomplete_gold} with incomplete gold"
        + (f" (unknown: {', '.join(result.skipped.unknown_examples)})" if result.skipped.unknown_examples else "")
        + (f", {result.outside_split} outside --split" if split else ""),
        highlight=False,
    )
    if result.dataset_info:
        stage_summary.print(f"dataset_info: {result.dataset_info}", highlight=False)
    if as_json:
        print_report(summary)


register(
    Command(
        "export kto",
        kto_cmd,
        reads={"responses": TableInput("responses"), "corpus": TableInput("questions"), "triples": TableInput("triples")},
        writes={"out": PathKind.REPORT},
        report="grtool.export.kto:KtoReport",
    )
)


@allows_empty
def gmr_cmd(
    corpus: Annotated[Path, typer.Argument(help="Corpus run directory holding questions/ and documents/.")],
    out: OutFile,
    split: Split = None,
    memorization: Annotated[bool, typer.Option("--memorization/--no-memorization", help="Also write corpus-memorization pairs (first 70% of a document's words → the rest).")] = False,
    chunk_questions: Annotated[int, typer.Option("--chunk-questions", min=1, help="Questions whose gold documents are held in memory at once.")] = 50_000,
    as_json: Json = False,
) -> None:
    """Write step-wise multi-hop retrieval pairs (GMR style) as JSON Lines.

    Per question, in hop order: <QUESTION> q </QUESTION> plus the <EVIDENCE> blocks retrieved so far → the next gold document, and a final DONE. With --memorization, also the first 70% of each document's words → the rest.

    Example: grtool export gmr out/corpus --out data/gmr_pairs.jsonl --memorization
    """
    refuse_json_with_stdout(as_json, out)

    from grtool.log import stage_summary
    from grtool.export.gmr import export_gmr

    result = export_gmr(corpus, out, memorization=memorization, chunk_questions=chunk_questions, splits=tuple(split or ()))
    stage_summary.print(
        f"{result.questions} questions → {result.retrieval_pairs} retrieval pairs; {result.memorization_pairs} memorization pairs; "
        f"skipped: {result.no_gold} without gold, {result.missing_gold_document} with a gold document missing"
        + (f" (e.g. {', '.join(result.missing_examples)})" if result.missing_examples else "")
        + (f", {result.too_short} documents too short to memorize" if memorization else "")
        + (f", {result.outside_split} outside --split" if split else ""),
        highlight=False,
    )
    if as_json:
        print_report(result.as_dict())


register(Command("export gmr", gmr_cmd, reads={"corpus": TableInput("questions", "documents")}, writes={"out": PathKind.REPORT}, report="grtool.export.gmr:GmrReport"))
