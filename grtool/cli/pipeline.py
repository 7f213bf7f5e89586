"""`grtool pipeline` commands."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, register
from grtool.cli.options import Json
from grtool.errors import InputError

register(Group("pipeline", "Run several stages from one TOML file."))


class Executor(str, Enum):
    local = "local"
    slurm = "slurm"


def run(
    ctx: typer.Context,
    config: Annotated[Path, typer.Argument(help="Pipeline TOML file (see examples/demo.toml).")],
    until: Annotated[Optional[str], typer.Option("--until", help="Stop after this stage.")] = None,
    start: Annotated[Optional[str], typer.Option("--from", help="Start at this stage.")] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan (state and exact command of each stage; with --executor slurm the sbatch scripts and the job dependencies) and exit.")
    ] = False,
    overrides: Annotated[
        Optional[list[str]],
        typer.Option("--set", help="Override a value: stage.key=value (an option), stage.slurm.key=value, slurm.key=value, vars.name=value (a [vars] value, wherever it is used) (repeatable)."),
    ] = None,
    summary_json: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", help="Also write the summary (rows and rejects per stage) as JSON to FILE.")] = None,
    old_summary_json: Annotated[Optional[Path], typer.Option("--summary-json", hidden=True, help="The old name of --json (deprecated).")] = None,
    overwrite: Annotated[
        Optional[list[str]],
        typer.Option(
            "--overwrite",
            metavar="STAGE",
            help="Run this stage with --overwrite when it runs: its output is replaced, not resumed or refused "
            "(after a changed option; repeatable). Done stages stay skipped; --overwrite is not part of the command a stage records.",
        ),
    ] = None,
    executor: Annotated[
        Executor,
        typer.Option("--executor", help="local: the stages one after another in this process; slurm: one sbatch job per stage (an array for slurm.tasks), chained by their data dependencies."),
    ] = Executor.local,
    wait: Annotated[bool, typer.Option("--wait", help="With --executor slurm: block until the jobs end; exit non-zero naming a failed job and its log.")] = False,
    check_env: Annotated[
        bool,
        typer.Option(
            "--check-env/--no-check-env",
            help="With --executor slurm: before the plan or the submission, import the "
            "packages each stage needs (vllm, torch, ...) the way its job will: its setup line, then python. "
            "--no-check-env: a plan made away from the cluster's environment.",
        ),
    ] = True,
) -> None:
    """Run the stages of a pipeline file in order; finished stages and shards are skipped.

    A stage whose inputs changed since it ran is run again with --overwrite. One whose options changed runs as
    its command would: it resumes, or refuses an output made with other options (exit 2) until named with
    --overwrite STAGE.

    Example: grtool pipeline run examples/demo.toml --until triples --set triples.limit=20
    """
    import orjson

    from grtool.log import lines, log, stage_summary
    from grtool.cli.stages import CliCommands
    from grtool.pipeline.config import load_pipeline
    from grtool.pipeline.executors import LocalExecutor
    from grtool.pipeline.runner import check_overwrite_names, check_stage_arguments, refuse_writes_over_inputs
    from grtool.store.outputs import check_file_output, refuse_export
    from grtool.store.partloop import claim_file

    if old_summary_json is not None:
        if summary_json is not None:
            raise InputError("--summary-json is the old name of --json: give one of them")
        log.warning("--summary-json is deprecated: use --json FILE (the same file)")
        summary_json = old_summary_json
    if wait and executor is not Executor.slurm:
        raise InputError("--wait: only with --executor slurm (the local executor always runs the stages to the end)")
    if summary_json and executor is Executor.slurm and not wait and not dry_run:
        raise InputError("--json: with --executor slurm only together with --wait (the summary is made when the jobs ended)")
    COMMANDS = CliCommands(ctx.find_root().command)  # the stages run through the same `grtool` command
    pipeline = load_pipeline(config, overrides, COMMANDS)
    refuse_writes_over_inputs(COMMANDS, pipeline, {"--json": str(summary_json) if summary_json else None})
    if dry_run:  # writes nothing: the file is checked, not claimed
        check_file_output(summary_json, "--json", inputs=[config])
        refuse_export(summary_json, "--json")
    with claim_file(None if dry_run else summary_json, "--json", inputs=[config], stdout=True) as summary_file:
        forced = check_overwrite_names(COMMANDS, pipeline, overwrite or [])
        stages = pipeline.select(start, until)
        check_stage_arguments(COMMANDS, pipeline, stages, forced)
        if executor is Executor.slurm:
            from grtool.pipeline.slurm import SlurmExecutor

            runner = SlurmExecutor(pipeline, COMMANDS, stages, forced, wait=wait, check_env=check_env)
        else:
            runner = LocalExecutor(pipeline, COMMANDS, stages, forced)
        if dry_run:
            runner.dry_run()
            return
        rows = runner.run()
        if rows is None:  # submitted, not waited for: nothing to summarise yet
            return
        if summary_file is not None:
            summary_file.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    if pipeline.note:
        stage_summary.print(lines(pipeline.note.strip().splitlines()), highlight=False, soft_wrap=True)  # its lines as written


register(Command("pipeline run", run, reads={"config": PathKind.FILE}, writes={"summary_json": PathKind.REPORT, "old_summary_json": PathKind.REPORT}, stage=False))


def status(
    target: Annotated[Path, typer.Argument(help="The pipeline TOML file, or the run directory it writes (its out).")],
    overrides: Annotated[Optional[list[str]], typer.Option("--set", help="The same --set values as the run (they may move its out and its outputs).")] = None,
    as_json: Json = False,
) -> None:
    """Where each stage stands: done or not (and why), when it finished; for a run submitted to Slurm, each
    stage's jobs, their states and the log of every failed job or array task.

    Example: grtool pipeline status examples/slurm/recipe.toml
    """
    import orjson

    from grtool.pipeline.status import has_records, pipeline_status, run_status, status_lines

    if target.is_dir():
        if overrides:
            raise InputError("--set: only with a pipeline file (a run directory's stages are read from its records)")
        if not has_records(target):
            raise InputError(f"{target}: no pipeline records (no {target}/_pipeline/*.json); give the pipeline file or its out directory")
        out, rows = target, run_status(target)
    else:
        from grtool.cli.stages import CliCommands
        from grtool.pipeline.config import load_pipeline

        pipeline = load_pipeline(target, overrides, CliCommands())
        out, rows = Path(pipeline.out), pipeline_status(pipeline)
    if as_json:
        print(orjson.dumps({"out": str(out), "stages": rows}, option=orjson.OPT_INDENT_2).decode())
        return
    import shutil
    import sys

    from grtool.userinput import log_width

    width = log_width(sys.stdout) or shutil.get_terminal_size().columns  # wider: one block per stage
    print("\n".join(status_lines(rows, width)), flush=True)


register(Command("pipeline status", status, stage=False))


def finalize(
    job: Annotated[Path, typer.Argument(help="A stage's job record (OUT/_pipeline/slurm/STAGE.json).")],
    merge: Annotated[bool, typer.Option("--merge", help="Merge the shard records of the stage's directories first (after an array).")] = False,
    stdout_from: Annotated[Optional[Path], typer.Option("--stdout-from", help="The job's stdout, to put in place of the stage's stdout file.")] = None,
) -> None:
    """The last step of a stage's Slurm job: check its outputs are complete and write its completion record."""
    from grtool.pipeline.slurm import finalize_stage

    finalize_stage(job, merge=merge, stdout_from=stdout_from)


register(Command("pipeline finalize", finalize, hidden=True, stage=False))
