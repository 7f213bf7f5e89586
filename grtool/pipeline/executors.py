"""How a pipeline's stages get run: one executor interface, a local and a Slurm implementation.

Modelled on datatrove's Local/Slurm pipeline executors: the executor owns running the stages, skipping what is
finished and where logs go; a stage is only its ``grtool …`` command line and knows nothing of either. Both
executors know the stage commands only through :class:`grtool.pipeline.registry.StageCommands` (what a command
accepts, how it parses its options, how to run it in this process), handed in by the caller.

- :class:`LocalExecutor` runs the stages one after another in this process.
- :class:`grtool.pipeline.slurm.SlurmExecutor` submits one sbatch job per stage (an array for ``tasks = N``),
  chained by ``--dependency=afterok`` along the stages' data dependencies.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from grtool.log import console, lines, log, stage_summary
from grtool.userinput import controls_escaped
from grtool.pipeline.config import Pipeline, Stage
from grtool.pipeline.registry import StageCommands
from grtool.pipeline.runner import StageState, check_input_paths, mark_done, plan, require_extras, run_stage, runs_with_overwrite, stage_state, summarize


class PipelineExecutor(ABC):
    """Runs ``stages`` of ``pipeline``; ``overwrite`` names the stages the user asked to replace (``--overwrite STAGE``)."""

    def __init__(self, pipeline: Pipeline, commands: StageCommands, stages: list[Stage], overwrite: set[str] | None = None):
        self.pipeline = pipeline
        self.commands = commands
        self.stages = stages
        self.overwrite = overwrite or set()

    def plan(self) -> list[StageState]:
        return plan(self.pipeline, self.stages)

    def with_overwrite(self, state: StageState) -> bool:
        return state.state != "done" and runs_with_overwrite(self.commands, state, self.overwrite)

    @abstractmethod
    def dry_run(self) -> None:
        """Print what a run would do, on stdout; run and write nothing."""

    @abstractmethod
    def run(self) -> list[dict[str, Any]] | None:
        """Run (or submit) every stage that is not done; returns the summary rows when the stages ran here."""


class LocalExecutor(PipelineExecutor):
    """Every stage in this process, in file order; a stage found done (its record, its inputs) is skipped."""

    def dry_run(self) -> None:
        # Plain lines on stdout, so the commands can be copied or piped into a shell script: a command line as
        # bash runs it (a control character as $'\x1b', never raw), a comment with its control characters escaped.
        states = self.plan()
        check_input_paths(self.commands, self.pipeline, states)
        say = [f"# relative paths are resolved from {controls_escaped(str(Path.cwd()))}, where the stages run"]
        for s in states:
            detail = f" ({s.detail})" if s.detail else ""
            say.append(controls_escaped(f"# {s.stage.name}: {s.state}{detail}; outputs: {', '.join(s.stage.outputs) or '-'}"))
            say.append(s.stage.command_line(self.with_overwrite(s)))
        remaining = [s.stage.name for s in states if s.state != "done"]
        say.append(controls_escaped(f"# {len(remaining)} of {len(states)} stages to run" + (f": {', '.join(remaining)}" if remaining else "")))
        print("\n".join(say), flush=True)

    def run(self) -> list[dict[str, Any]]:
        require_extras(self.commands, self.stages)
        check_input_paths(self.commands, self.pipeline, self.plan())
        stages = self.stages
        for n, stage in enumerate(stages):
            s = stage_state(self.pipeline, stage)  # anew: a stage before it may just have remade its inputs
            if s.state == "done":
                log.info("stage %s: done, skipped", stage.name)
                continue
            overwrite = runs_with_overwrite(self.commands, s, self.overwrite)
            if s.state in ("inputs changed", "outputs changed"):
                log.warning("stage %s: %s", stage.name, s.detail)
            log.info("stage %s: %s", stage.name, stage.command_line(overwrite))
            try:
                seconds = run_stage(self.commands, stage, overwrite=overwrite)
            except BaseException as e:  # what ran and what is left stays in the log; the error line comes after
                print_summary(stages[:n])
                _print_failure(stage, overwrite, e, stages[:n], stages[n + 1 :])
                if not overwrite and "use --overwrite" in str(e):
                    log.warning("to replace the output of stage %s, run the pipeline again with --overwrite %s", stage.name, stage.name)
                raise
            mark_done(self.pipeline.out, stage, seconds)
        return print_summary(stages)


def print_summary(stages: list[Stage]) -> list[dict]:
    """The rows and rejects of ``stages`` as a table (silent under --quiet); returns the rows."""
    from rich.table import Table

    rows = summarize(stages)
    if not rows:
        return rows
    table = Table(title="pipeline summary")
    for col in ("stage", "rows", "rejected", "outputs"):
        table.add_column(col, overflow="fold")
    for r in rows:
        counts = lines(f"{Path(t).name}: {n}" for t, n in r["tables"].items()) if r["tables"] else "-"
        rejected = lines(f"{k}: {v}" for k, v in r["rejected"].items()) if r["rejected"] else "0"
        table.add_row(r["stage"], counts, rejected, lines(r["outputs"]))
    stage_summary.print(table)
    return rows


def _print_failure(stage: Stage, overwrite: bool, error: BaseException, done: list[Stage], left: list[Stage]) -> None:
    """The stages done, the one that failed with its exact command line (to rerun it alone), the ones left."""
    from grtool.errors import EXIT_INTERRUPTED
    from grtool.signals import Stopped

    code = EXIT_INTERRUPTED if isinstance(error, KeyboardInterrupt) else getattr(error, "exit_code", None)
    how = "stopped" if isinstance(error, (Stopped, KeyboardInterrupt)) else "failed"  # a signal: resumable, not broken
    said = [
        f"pipeline stopped at stage {stage.name}" + (f" (exit code {code})" if code is not None else ""),
        f"  done:   {', '.join(s.name for s in done) or '-'}",
        f"  {how}:{' ' * (6 - len(how))} {stage.command_line(overwrite)}",
        f"  left:   {', '.join(s.name for s in left) or '-'}",
    ]
    for line in said:  # one print a line: a newline inside a printed string is escaped as data
        console.print(line, markup=False, highlight=False, soft_wrap=True)
