"""`grtool eval` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import orjson
import typer
from rich.table import Table

from grtool.cli.options import Json, Plot
from grtool.errors import DataProblem
from grtool.log import console

app = typer.Typer(name="eval", help="Score model responses (retrieval recall).", no_args_is_help=True)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


@app.command("recall")
def recall_cmd(
    responses: Annotated[Path, typer.Argument(help='A `grtool retrieve` output directory, or JSON Lines of {"qid": ..., "response": ...}; several lines per qid = samples ("-" = stdin).')],
    corpus: Annotated[Path, typer.Option("--corpus", help="Corpus run directory (holding questions/), or its questions stage.")],
    triples: Annotated[Path, typer.Option("--triples", help="Triples stage directory (or a run directory holding triples/).")],
    as_json: Json = False,
) -> None:
    """Retrieval recall of model responses: |retrieved ∩ gold| / |gold| per response.

    Docids are read in special-token form or in square brackets. A triple held by several documents retrieves all of them; a docid written tail-first counts; a docid found nowhere is a hallucination; broken or empty markers are counted as malformed. --json prints an object with recall, per_dataset, hallucinated_share and malformed.

    Example: grtool eval recall samples.jsonl --corpus out/corpus --triples out/triples --json
    """
    from grtool.export.readers import DocidIndex, QuestionIndex
    from grtool.evaluation.recall import evaluate_recall
    from grtool.store.coverage import check_triples_cover

    check_triples_cover(triples, corpus)
    report = evaluate_recall(responses, QuestionIndex.build(corpus), DocidIndex.build(triples))
    if as_json:
        typer.echo(orjson.dumps(report).decode())
    else:
        print_recall(report)
    if report["responses"] == 0:
        raise DataProblem(f"{responses}: no response could be scored (unknown qids or no gold documents)")


def print_recall(report: dict) -> None:
    """The recall table per dataset (and what was not scored), as `eval recall` prints it."""
    if report["responses"]:
        table = Table(title="retrieval recall")
        for col in ("dataset", "responses", "recall", "exact", "docs/response", "hallucinated", "flipped", "malformed"):
            table.add_column(col, justify="left" if col == "dataset" else "right")
        rows = [*report["per_dataset"].items(), ("all", report)]
        for name, r in rows:
            table.add_row(
                name,
                str(r["responses"]),
                _fmt(r["recall"]),
                _fmt(r["exact_match_share"]),
                _fmt(r["docs_per_response"], 2),
                f"{r['hallucinated']}/{r['docids']} ({_fmt(r['hallucinated_share'], 3)})",
                str(r["flipped"]),
                str(r["malformed"]),
                style="bold" if name == "all" else None,
            )
        console.print(table)
    if report["unknown_qid"] or report["no_gold"] or report["incomplete_gold"]:
        examples = f" (e.g. {', '.join(report['unknown_qid_examples'])})" if report["unknown_qid_examples"] else ""
        console.print(
            f"[yellow]not scored:[/] {report['unknown_qid']} responses with an unknown qid{examples}, "
            f"{report['no_gold']} for questions without gold documents, "
            f"{report['incomplete_gold']} for questions whose gold is incomplete (meta.gold_titles_missing)",
            highlight=False,
        )


@app.command("compare")
def compare_cmd(
    reports: Annotated[list[str], typer.Argument(help="Recall reports of `eval recall --json`, as LABEL=FILE (or FILE: labelled by its name).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the Markdown table here (default: print it).")] = None,
    plot: Plot = None,
    as_json: Json = False,
) -> None:
    """Recall per dataset of several runs side by side (e.g. base few-shot, after SFT, after KTO).

    Example: grtool eval compare base=reports/recall-base.json sft=reports/recall-sft.json --out reports/recall.md --plot reports/recall.png
    """
    from grtool.evaluation.compare import load_runs, markdown, plot as plot_runs, table

    from grtool.store.outputs import refuse_output_among_inputs

    given = [r.split("=", 1)[1] if "=" in r and not Path(r).exists() else r for r in reports]
    for flag, target in (("--out", out), ("--plot", plot)):
        if target is not None:
            refuse_output_among_inputs(target, inputs=given, flag=flag)
    runs = load_runs(reports)
    if as_json:
        typer.echo(orjson.dumps(table(runs)).decode())
    text = markdown(runs)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    elif not as_json:
        typer.echo(text)
    if plot is not None:
        plot_runs(runs, plot)
