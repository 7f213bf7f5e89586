"""`grtool show` and `grtool report`: look at the rows of a stage, or at a whole run on one HTML page."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, PathKind, TableInput, register
from grtool.errors import InputError


def show_cmd(
    path: Annotated[Path, typer.Argument(help="A stage directory (chains, filtered, responses, triples: with verdicts; any other: its columns) or an exported file.")],
    qid: Annotated[Optional[list[str]], typer.Option("--qid", help="Rows of this question (repeat for several).")] = None,
    sample: Annotated[Optional[int], typer.Option("--sample", min=1, help="N rows drawn at random (reproducible with --seed).")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**32 - 1, help="Seed of --sample.")] = 0,
    limit: Annotated[int, typer.Option("--limit", min=0, help="Without --sample: the first N rows (0 = all).")] = 10,
    reason: Annotated[
        Optional[str],
        typer.Option("--reason", metavar="RULE", help="The stage's rejected rows whose reason is RULE (a rule such as gold, or a code such as gold-outside), with the verdict."),
    ] = None,
    corpus: Annotated[Optional[Path], typer.Option("--corpus", help="Corpus (run directory or questions stage); default: the one the stage was made from.")] = None,
    triples: Annotated[Optional[Path], typer.Option("--triples", help="Triples stage; default: the one the stage was made from.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines on stdout: one object per row, docids with their verdicts.")] = False,
) -> None:
    """Rows of a stage beside their question, answer and gold documents, docids marked by verdict.

    Each docid is marked gold, non-gold or hallucinated, and every document id is shown with its title. A stage of
    any other table (a corpus's questions or documents, a table a command declared) is shown by its columns.

    On a terminal the docids are coloured (green gold, yellow non-gold, red hallucinated); piped, the same lines
    come as plain text with the verdict in brackets.

    A stage (or export) that validate fails (a stopped run, a damaged record, an incomplete stage) has its rows
    shown, then validate's problems on stderr, and exit 1.

    Example: grtool show out/demo/filtered --reason gold --sample 3
    """
    import orjson

    from grtool.inspect.rows import Pick, as_json as row_json, load_rows
    from grtool.inspect.sources import open_source

    if reason is not None and not reason.strip():
        raise InputError("--reason: name a rule (e.g. gold) or a reason code (e.g. gold-outside)")
    source = open_source(path, corpus, triples)
    from grtool.audit.validate import validate_tree

    failed = [v for v in validate_tree(source.path) if not v.ok]  # validate's verdict, printed after the rows
    rows = load_rows(source, Pick(tuple(qid or ()), sample, seed, limit, reason))
    if not rows and qid:
        raise InputError(f"{path}: no row of {', '.join(qid)}")
    from rich.markup import escape

    from grtool.log import console as log_console

    for note in source.notes:
        log_console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    try:
        if as_json:
            sys.stdout.buffer.write(b"".join(orjson.dumps(row_json(row), default=str) + b"\n" for row in rows))
        else:
            _print_rows(rows)
        sys.stdout.flush()
    except BrokenPipeError:  # `grtool show ... | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    _fail_with(failed, f"{path}: FAIL validation; the rows above are of a stage that did not finish well")


def _fail_with(failed: list, message: str) -> None:
    """validate's lines for what failed, then the error (exit 1), as validate ends."""
    if failed:
        from grtool.cli.status_validate import print_verdicts
        from grtool.errors import DataProblem

        print_verdicts(failed)
        raise DataProblem(message)


register(Command("show", show_cmd, reads={"path": PathKind.STAGE, "corpus": PathKind.STAGE, "triples": TableInput("triples")}))


def _print_rows(rows: list) -> None:
    """Coloured on a terminal (never wrapped by Rich), plain text elsewhere."""
    from rich.console import Console
    from rich.text import Text

    from grtool.inspect.render import row_lines, summary_line

    lines = [line for i, row in enumerate(rows, 1) for line in (*row_lines(row, i, len(rows)), Text(""))] + [summary_line(rows)]
    if sys.stdout.isatty():
        terminal = Console(highlight=False, soft_wrap=True)
        for line in lines:
            terminal.print(line)
    else:
        sys.stdout.write("".join(line.plain + "\n" for line in lines))


def report_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory (a pipeline's out), or any directory holding stage directories.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="FILE", help="HTML file to write (default: RUN/reports/report.html).")] = None,
) -> None:
    """One self-contained HTML page of a whole run (it opens without a network).

    The page carries validate's verdict of every stage, index and export: one that failed (a stopped run, a damaged
    record, an incomplete stage) is marked on the page and listed on stderr, and the exit is 1, as validate's.
    A directory holding nothing grtool wrote is exit 1, with no page.

    Each stage's rows, rejects by reason and time; the funnel questions → chained → kept → exported → recall;
    filter reasons with examples; collisions and overlap; every recall result with the comparison plot; the exact
    command of each stage.

    Example: grtool report out/demo --out out/demo/reports/report.html
    """
    from grtool.inspect.report import write_report
    from grtool.log import stage_summary

    target, failed = write_report(run, out)
    stage_summary.print(f"wrote {target}", highlight=False, markup=False, soft_wrap=True)
    _fail_with(failed, f"{run}: {len(failed)} output(s) FAIL validation, marked on the page")


register(Command("report", report_cmd, reads={"run": PathKind.RUN}, writes={"out": PathKind.REPORT}))
