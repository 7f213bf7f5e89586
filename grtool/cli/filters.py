"""`grtool filters` commands."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, TableInput, TableOutput, register
from grtool.cli.options import allows_empty, CannotAnswer, Json, NumShards, Out, Overwrite, ShardIndex, Split, check_cannot_answer, print_report
from grtool.errors import InputError

register(Group("filters", "Filter chains (format, existing triples, gold coverage, answers, redundancy)."))


class Redundant(str, Enum):
    reject = "reject"
    trim = "trim"


@allows_empty
def apply_cmd(
    chains: Annotated[Path, typer.Argument(help="Chains stage directory (or a run directory holding chains/; '-' = JSON Lines on stdin).")],
    corpus: Annotated[Path, typer.Option("--corpus", help="Ingested corpus run directory (its questions/ are used).")],
    triples: Annotated[Path, typer.Option("--triples", help="Triples stage directory (or a run directory holding triples/).")],
    out: Out,
    split: Split = None,
    rules: Annotated[Optional[str], typer.Option("--rules", help="Comma list of rules (default all): format,docid-exists,gold,answer,redundant,length.")] = None,
    min_recall: Annotated[float, typer.Option("--min-recall", min=0.0, max=1.0, help="Share of gold documents a chain must retrieve.")] = 1.0,
    redundant: Annotated[Redundant, typer.Option("--redundant", help="A repeated triple or a repeated step (same thought, same documents): reject the chain, or trim the step.")] = Redundant.reject,
    max_docids: Annotated[int, typer.Option("--max-docids", min=1, help="At most this many docids per chain.")] = 10,
    max_chain_tokens: Annotated[int, typer.Option("--max-chain-tokens", min=1, help="At most this many whitespace-separated tokens.")] = 512,
    docid_start: Annotated[Optional[str], typer.Option("--docid-start", help="Marker before each docid (default: as recorded in the chains manifest, else <docid_start>).")] = None,
    docid_end: Annotated[Optional[str], typer.Option("--docid-end", help="Marker after each docid (default: as recorded in the chains manifest, else <docid_end>).")] = None,
    all_candidates: Annotated[bool, typer.Option("--all-candidates", help="Mark every passing candidate selected (kept), not only the lowest-score one per question.")] = False,
    cannot_answer: CannotAnswer = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write the report as Markdown to this file.")] = None,
    as_json: Json = False,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
) -> None:
    """Judge every candidate; write those that pass every rule, reject the others to _rejects with all their reasons.

    Per question the kept chain (selected = true) is the passing candidate with the lowest score (GReG's
    entropy), or the first passing one in candidate order when they have no score; export sft exports those.
    The report gives the yield per dataset (questions with a kept chain / questions synthesized) and the
    questions lost because no candidate passed, per rule.

    Rules: format (balanced, unnested markers; at least one docid; no empty triple part), docid-exists (each
    docid is a stored triple, as written or flipped tail-to-head), gold (each docid a stored triple of a gold
    document; gold recall >= --min-recall; a triple in several documents covers them all; passes for
    unanswerable questions, which have no gold), answer (the conclusion, i.e. the text after the last
    "answer is", else after the last docid, contains the gold answer or an alias after SQuAD normalization;
    "cannot answer" fails an answerable question and is required for an unanswerable one), redundant (the
    same triple twice, either orientation, or a step whose thought text and documents repeat the previous
    step's; --redundant trim removes such steps; a different triple of a retrieved document is new), length (--max-docids, --max-chain-tokens). Chains whose qid is not in the corpus are
    rejected.
    Exit 0 when it ran, whatever it rejected; 2 on input errors.

    Example: grtool filters apply out/chains --corpus out/corpus --triples out/triples --split train --out out/filtered --report out/filters.md
    """
    from rich.table import Table

    from grtool.log import log, stage_summary
    from grtool.filters.apply import FilterConfig, apply_filters
    from grtool.filters.report import render_markdown
    from grtool.filters.rules import Settings, parse_rules

    if as_json and str(out) == "-":
        raise InputError("--json and --out - both want stdout; write the chains to a directory or drop --json")
    config = FilterConfig(
        rules=parse_rules(rules),
        settings=Settings(min_recall=min_recall, redundant=redundant.value, max_docids=max_docids, max_chain_tokens=max_chain_tokens, cannot_answer=check_cannot_answer(cannot_answer)),
        all_candidates=all_candidates,
        docid_start=docid_start,
        docid_end=docid_end,
        splits=tuple(split or ()),
    )
    from grtool.store.outputs import input_stage, refuse_overlapping_outputs
    from grtool.store.partloop import claim_file

    stages = [input_stage(chains, "chains"), input_stage(corpus, "questions"), input_stage(triples, "triples")]
    refuse_overlapping_outputs([("--out", out), ("--report", report)], inputs=stages, holders=[chains, corpus, triples])
    with claim_file(report, "--report", inputs=stages) as report_file:  # held from before the stage runs
        result = apply_filters(chains, corpus, triples, out, config, overwrite=overwrite, num_shards=num_shards, shard_index=shard_index)
        if report_file is not None:
            log.info("wrote %s", report_file.write(render_markdown(result).encode()))
    if as_json:
        print_report(result)
        return

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f}%"

    table = Table(
        title=f"filters: {result['questions_kept']} of {result['questions']} questions keep a chain (yield {pct(result['yield'])}); {result['passed']} of {result['chains']} candidates passed"
    )
    lost = [f"lost: {r}" for r in result["lost"]]
    for col in ("dataset", "questions", "kept", "yield", "judged", "passed", "pass rate", *result["rules"], *lost):
        table.add_column(col, justify="left" if col == "dataset" else "right", overflow="fold")  # never "…" in a header
    for name, d in result["datasets"].items():
        table.add_row(
            name, str(d["questions"]), str(d["questions_kept"]), pct(d["yield"]), str(d["chains"]), str(d["passed"]), pct(d["pass_rate"]),
            *(str(d["rules"].get(r, 0)) for r in result["rules"]), *(str(d["lost"].get(r, 0)) for r in result["lost"]),
        )  # fmt: skip
    stage_summary.print(table)


register(
    Command(
        "filters apply",
        apply_cmd,
        reads={"chains": TableInput("chains"), "corpus": TableInput("questions"), "triples": TableInput("triples")},
        writes={"out": TableOutput("chains"), "report": PathKind.REPORT},
        report="grtool.filters.report:FiltersReport",
    )
)
