"""`grtool pipeline` commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import orjson
import typer
from rich.table import Table

from grtool.log import console, log, stage_summary
from grtool.pipeline.config import Stage, load_pipeline
from grtool.pipeline.runner import (check_overwrite_names, check_stage_arguments, mark_done, plan, refuse_writes_over_inputs, require_extras, run_stage,
                                    runs_with_overwrite, stage_state, summarize)

app = typer.Typer(name="pipeline", help="Run several stages from one TOML file.", no_args_is_help=True)

@app.command("run")
def run(
    config: Annotated[Path, typer.Argument(help="Pipeline TOML file (see examples/demo.toml).")],
    until: Annotated[Optional[str], typer.Option("--until", help="Stop after this stage.")] = None,
    start: Annotated[Optional[str], typer.Option("--from", help="Start at this stage.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (state and exact command of each stage) and exit.")] = False,
    overrides: Annotated[
        Optional[list[str]], typer.Option("--set", help="Override an option: stage.key=value (repeatable).")
    ] = None,
    summary_json: Annotated[Optional[Path], typer.Option("--summary-json", help="Also write the summary as JSON here.")] = None,
    overwrite: Annotated[
        Optional[list[str]],
        typer.Option("--overwrite", metavar="STAGE", help="Run this stage with --overwrite when it runs: its output is replaced, not resumed or refused "
                     "(after a changed option; repeatable). Done stages stay skipped; --overwrite is not part of the command a stage records."),
    ] = None,
) -> None:
    """Run the stages of a pipeline file in order; finished stages and shards are skipped.

    A stage whose inputs changed since it ran is run again with --overwrite. One whose options changed runs as
    its command would: it resumes, or refuses an output made with other options (exit 2) until named with
    --overwrite STAGE.

    Example: grtool pipeline run examples/demo.toml --until triples --set triples.limit=20
    """
    pipeline = load_pipeline(config, overrides)
    refuse_writes_over_inputs(pipeline.stages, {"--summary-json": str(summary_json) if summary_json else None})
    forced = check_overwrite_names(pipeline, overwrite or [])
    stages = pipeline.select(start, until)
    check_stage_arguments(pipeline, stages, forced)
    if dry_run:
        states = plan(pipeline, stages)
        # Plain lines on stdout, so the commands can be copied or piped into a shell script.
        for s in states:
            detail = f" ({s.detail})" if s.detail else ""
            typer.echo(f"# {s.stage.name}: {s.state}{detail}; outputs: {', '.join(s.stage.outputs) or '-'}")
            typer.echo(s.stage.command_line(s.state != "done" and runs_with_overwrite(s, forced)))
        remaining = [s.stage.name for s in states if s.state != "done"]
        typer.echo(f"# {len(remaining)} of {len(states)} stages to run" + (f": {', '.join(remaining)}" if remaining else ""))
        return
    require_extras(stages)
    for n, stage in enumerate(stages):
        s = stage_state(pipeline, stage)  # anew: a stage before it may just have remade its inputs
        if s.state == "done":
            log.info("stage %s: done, skipped", stage.name)
            continue
        overwrite = runs_with_overwrite(s, forced)
        if s.state == "inputs changed":
            log.warning("stage %s: %s", stage.name, s.detail)
        log.info("stage %s: %s", stage.name, stage.command_line(overwrite))
        try:
            seconds = run_stage(stage, overwrite=overwrite)
        except BaseException as e:  # what ran and what is left stays in the log; the error line comes after
            _print_summary(stages[:n])
            _print_failure(stage, overwrite, e, stages[:n], stages[n + 1 :])
            if not overwrite and "use --overwrite" in str(e):
                log.warning("to replace the output of stage %s, run the pipeline again with --overwrite %s", stage.name, stage.name)
            raise
        mark_done(pipeline, stage, seconds)
    rows = _print_summary(stages)
    if summary_json:
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        summary_json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    if pipeline.note:
        stage_summary.print(pipeline.note.strip(), highlight=False, soft_wrap=True)


def _print_summary(stages: list[Stage]) -> list[dict]:
    """The rows and rejects of ``stages`` as a table (silent under --quiet); returns the rows."""
    rows = summarize(stages)
    if not rows:
        return rows
    table = Table(title="pipeline summary")
    for col in ("stage", "rows", "rejected", "outputs"):
        table.add_column(col, overflow="fold")
    for r in rows:
        counts = "\n".join(f"{Path(t).name}: {n}" for t, n in r["tables"].items()) or "-"
        rejected = "\n".join(f"{k}: {v}" for k, v in r["rejected"].items()) or "0"
        table.add_row(r["stage"], counts, rejected, "\n".join(r["outputs"]))
    stage_summary.print(table)
    return rows


def _print_failure(stage: Stage, overwrite: bool, error: BaseException, done: list[Stage], left: list[Stage]) -> None:
    """The stages done, the one that failed with its exact command line (to rerun it alone), the ones left."""
    from grtool.errors import EXIT_INTERRUPTED
    from grtool.signals import Stopped

    code = EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else getattr(error, "exit_code", None)
    how = "stopped" if isinstance(error, (Stopped, KeyboardInterrupt)) else "failed"  # a signal: resumable, not broken
    lines = [
        f"pipeline stopped at stage {stage.name}" + (f" (exit code {code})" if code is not None else ""),
        f"  done:   {', '.join(s.name for s in done) or '-'}",
        f"  {how}:{' ' * (6 - len(how))} {stage.command_line(overwrite)}",
        f"  left:   {', '.join(s.name for s in left) or '-'}",
    ]
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
