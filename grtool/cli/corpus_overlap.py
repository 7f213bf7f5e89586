"""`grtool corpus overlap`: registered on the `corpus` sub-app (kept in its own file)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grtool.cli.commands import Command, PathKind, TableInput, register
from grtool.cli.options import Json, Plot, plot_extras, print_report


def overlap_cmd(
    corpus: Annotated[Path, typer.Argument(help="Ingested corpus: a run directory holding questions/ and documents/.")],
    n: Annotated[str, typer.Option("--n", help="n-gram sizes: a range 4-12, a list 4,6,8 or one size.")] = "4-12",
    as_json: Json = False,
    plot: Plot = None,
) -> None:
    """Over-specification: the share of each question's n-grams found verbatim in its gold documents.

    Text is lowercased and split into \\w+ tokens (NLTK RegexpTokenizer); a document is its title then its
    text. Per dataset: the mean overlap for every n, and the share of questions with any shared n-gram.
    Questions with fewer than n tokens are left out for that n.

    Example: grtool corpus overlap out/hotpot --n 4-12 --plot out/overlap.png
    """
    from rich.table import Table

    from grtool.log import console, log
    from grtool.corpus.overlap import corpus_overlap, iter_table_rows, parse_ns, plot_overlap
    from grtool.store.outputs import input_stage, refuse_overlapping_outputs
    from grtool.store.partloop import claim_file

    read = [input_stage(corpus, "questions"), input_stage(corpus, "documents")]
    refuse_overlapping_outputs([("--plot", plot)], inputs=read, holders=[corpus])
    with claim_file(plot, "--plot", inputs=read) as plot_file:
        report = corpus_overlap(corpus, parse_ns(n))
        if plot_file is not None:
            log.info("wrote %s", plot_file.write_with(lambda tmp: plot_overlap(report, tmp)))
    if as_json:
        print_report(report.to_json())
        return
    table = Table(title="mean question n-gram overlap with gold documents (%)")
    table.add_column("dataset")
    table.add_column("q", justify="right")
    for size in report.ns:
        table.add_column(f"n={size}", justify="right")
    for ds, cells in iter_table_rows(report):
        table.add_row(ds, str(report.questions[ds]), *cells)
    console.print(table)
    share = Table(title="questions with at least one shared n-gram (%)")
    share.add_column("dataset")
    for size in report.ns:
        share.add_column(f"n={size}", justify="right")
    for ds in sorted(report.share_any):
        share.add_row(ds, *("–" if v is None else f"{100 * v:.1f}" for v in report.share_any[ds].values()))
    console.print(share)
    for reason, count in report.left_out.items():
        console.print(f"left out: {count} questions ({reason.replace('_', ' ')})")


register(
    Command(
        "corpus overlap",
        overlap_cmd,
        reads={"corpus": TableInput("questions", "documents", kind=PathKind.RUN)},
        writes={"plot": PathKind.REPORT},
        extras=plot_extras,
        report="grtool.corpus.overlap:OverlapSummary",
    )
)
