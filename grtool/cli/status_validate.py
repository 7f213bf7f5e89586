"""`grtool status` and `grtool validate`, which work on any stage directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from grtool.cli.commands import Command, PathKind, register
from grtool.cli.options import Json
from grtool.errors import EXIT_DATA, InputError
from grtool.errors import printable
from grtool.userinput import require_input

if TYPE_CHECKING:
    from rich.table import Table


def status_cmd(
    directory: Annotated[Path, typer.Argument(help="A stage directory, or a run directory holding several.")],
    as_json: Json = False,
) -> None:
    """Shards done and pending, rows, and rejects by reason; for a run directory also its indexes, exported files,
    checkpoints, and the stages of the pipeline that wrote it with their times.

    Example: grtool status out/demo/triples
    """
    import msgspec
    import orjson

    from grtool.log import console
    from grtool.inspect.contents import run_contents
    from grtool.store.records import is_stage_dir
    from grtool.store.status import find_stage_dirs, status
    from grtool.store.stops import describe as describe_stop, describe_acceptance

    require_input(directory)
    dirs = find_stage_dirs(directory)
    contents = run_contents(directory)
    piped = _pipeline_wrote(directory)  # its records show a pipeline's jobs, before any stage wrote
    if not dirs and not any(contents.values()) and not piped:
        from grtool.audit.validate import not_shown

        raise not_shown(directory)  # validate's verdict on it when nothing grtool wrote is there
    results = [status(d, footers=False) for d in dirs]  # the records and the parts' sizes: no Parquet read
    if as_json:
        # A stage directory: its status object. A run directory: one object holding what the tables show.
        stages = [{**r, "stops": msgspec.to_builtins(r["stops"])} for r in results]  # the stop records as JSON
        shown = stages[0] if is_stage_dir(directory) and len(stages) == 1 else {"stages": stages, **contents, **_pipeline_json(directory)}
        typer.echo(orjson.dumps(shown).decode())
        return
    # the tables name what they list relative to it (they fit a terminal); the directory itself whole, on one line
    console.print(f"{printable(Path(directory).resolve())}:", highlight=False, markup=False, soft_wrap=True)
    if results:
        console.print(_stage_table(results, Path(directory)))
    for title, rows in contents.items():
        if rows:
            console.print(_rows_table(title, rows, Path(directory)))
    if piped:
        from grtool.pipeline.slurm import slurm_jobs

        jobs = slurm_jobs(directory)  # asked once: with the controller down each question waits out Slurm's timeout
        _print_pipeline_stages(directory, jobs)
        _print_slurm_jobs(jobs)
    for s in results:  # what stopped a run, in full, one line each (the table cell only says that one did)
        for stop in s["stops"]:
            text = describe_stop(stop) if stop.accepted is None else describe_acceptance(stop)
            console.print(f"{printable(s['path'])}: {'' if stop.accepted is None else 'stop '}{text}", highlight=False, markup=False, soft_wrap=True)


register(Command("status", status_cmd, reads={"directory": PathKind.RUN}))


def _shown(path: str, root: Path) -> str:
    """A path under the directory asked about, relative to it (the table stays narrow); others as they are."""
    try:
        relative = Path(path).relative_to(root)
    except ValueError:
        return printable(path)
    return printable(relative) if str(relative) != "." else printable(path)


def _stage_table(results: list[dict], root: Path) -> Table:
    from rich.table import Table

    from grtool.log import lines

    t = Table(title="stage status")
    for col in ("stage", "table", "parts done", "pending", "rows", "s", "rows/s", "rejected", "complete"):
        # Paths (which tell the rows apart) fold rather than end in "…"; the rejected reasons wrap one per line.
        t.add_column(col, overflow="fold", ratio=3 if col in ("stage", "rejected") else None)
    for s in results:
        rej = s["counters"]["rejected"]
        rej_text = lines(f"{k}: {v}" for k, v in rej.items()) if rej else "0"
        planned = s["parts_planned"] if s["parts_planned"] is not None else "?"
        t.add_row(escape(_shown(s["path"], root)), s["table"], f"{s['parts_done']}/{planned}", str(len(s["parts_pending"])), str(s["rows"]),
                  _number(s["seconds"], ".1f"), _number(s["rows_per_second"], ".0f"),
                  rej_text, _complete(s))  # fmt: skip
    return t


def _number(value: float | None, spec: str) -> str:
    """A part timing for the table ("-": the shard records predate timing)."""
    return "-" if value is None else format(value, spec)


def _rows_table(title: str, rows: list[dict[str, str]], root: Path) -> Table:
    """Indexes, exports or checkpoints: one row each, their record's fields as columns."""
    from rich.table import Table

    t = Table(title=title)
    for col in rows[0]:
        t.add_column(col, overflow="fold", ratio=3 if col == "path" else None)
    for r in rows:
        t.add_row(*(escape(_shown(v, root) if k == "path" else printable(v)) for k, v in r.items()))
    return t


def _pipeline_wrote(directory: Path) -> bool:
    """Whether a pipeline keeps its records (stages done, Slurm jobs) in the directory. A stage directory, what
    `status` is asked most, has no records folder, and the pipeline's modules are then not even loaded."""
    from grtool.pipeline.records import RECORDS_DIR

    if not (Path(directory) / RECORDS_DIR).is_dir():
        return False
    from grtool.pipeline.status import has_records

    return has_records(Path(directory))


def _pipeline_json(directory: Path) -> dict[str, list[dict]]:
    """The pipeline stages and Slurm jobs of a run directory, as `status --json` prints them (empty lists when no
    pipeline wrote it)."""
    if not _pipeline_wrote(directory):
        return {"pipeline": [], "slurm_jobs": []}
    from grtool.pipeline.slurm import slurm_jobs
    from grtool.pipeline.status import run_status

    jobs = slurm_jobs(directory)
    return {"pipeline": run_status(Path(directory), jobs), "slurm_jobs": jobs}


def _print_pipeline_stages(directory: Path, jobs: list[dict]) -> None:
    """A run a pipeline wrote (``_pipeline/``): its stages in the order they finished, with their times."""
    from rich.table import Table

    from grtool.log import console
    from grtool.pipeline.status import run_status

    t = Table(title="pipeline stages")
    for col in ("stage", "state", "finished", "seconds"):
        t.add_column(col, overflow="fold")
    for r in run_status(Path(directory), jobs):
        seconds = f"{r['seconds']:g}" if isinstance(r["seconds"], (int, float)) else "-"
        t.add_row(escape(r["stage"]), r["state"], escape(str(r["finished"] or "-")), seconds)
    console.print(t)


def _print_slurm_jobs(rows: list[dict]) -> None:
    """A pipeline run directory run with --executor slurm: each stage's last jobs and their states."""
    from rich.table import Table

    from grtool.log import console
    from grtool.pipeline.slurm import job_label

    if not rows:
        return
    t = Table(title="slurm jobs")
    for col in ("stage", "job", "tasks", "states", "submitted"):
        t.add_column(col, overflow="fold")
    for r in rows:
        job = job_label(r["jobs"])
        t.add_row(r["stage"], job, str(r["tasks"]), r["summary"], r["submitted"] or "-")
    console.print(t)


def _complete(s: dict) -> str:
    """The "complete" cell: a stage whose last run failed is not complete, however many parts are done."""
    failed = [stop for stop in s["stops"] if stop.accepted is None]
    if failed:
        return "no: " + ", ".join(f"guard {x.guard} tripped" if x.kind == "guard" else "run failed" for x in failed)
    if s["complete"] and s["stops"]:
        return "yes (failure accepted)"
    return "yes" if s["complete"] else "no"


def validate_cmd(
    directory: Annotated[Path, typer.Argument(help="A stage directory, a run directory (everything under it is checked), an index directory or an exported file.")],
    as_json: Json = False,
    accept: Annotated[
        bool,
        typer.Option(
            "--accept",
            help="First accept the failed runs (tripped guards, errors) recorded in the stage directories under "
            "DIRECTORY: recorded with who, when and --reason, they become notes. Exit 2 when there is none.",
        ),
    ] = False,
    reason: Annotated[Optional[str], typer.Option("--reason", help="Why the failure is accepted (recorded with --accept).")] = None,
    accept_empty: Annotated[
        Optional[list[Path]],
        typer.Option(
            "--accept-empty",
            metavar="PATH",
            help="A stage directory or exported file (as a path, or relative to DIRECTORY) whose having no row is "
            "right: it passes with a note, for this validation only (repeatable). Exit 2 when PATH is no empty one.",
        ),
    ] = None,
) -> None:
    """Check stage directories, index directories and exported files: everything grtool wrote under DIRECTORY.

    Stages: schema, checksums, accounting (in = out + merged + rejected), keys and cross-table references; a
    folder of shards without _manifest.json is a problem. Indexes: every file against index.json, the index
    opens and looks up a few docids. Exports: each file against its .grtool.json record (unchanged, row count,
    row shape of its format, inputs unchanged) and dataset_info.json entries pointing at existing files.

    Exit 0 when clean, 1 with the list of problems otherwise (also when nothing grtool wrote is found). Notes
    (e.g. a manifest not yet re-merged after a later array task committed a shard) are shown but do not fail
    validation. A questions directory is checked against its sibling documents directory whenever one exists.
    A stage whose last run failed (a guard such as --max-empty-share tripped, or an error) fails until a run of
    it succeeds or the failure is accepted with --accept. A stage or export without a row fails too (a run that
    stopped on it: as a failed run) unless the command that wrote it was given --allow-empty or it is named with
    --accept-empty.

    Example: grtool validate out/demo
    """
    import orjson

    from grtool.log import console
    from grtool.audit.validate import accept_tree, validate_tree
    from grtool.store.stops import describe as describe_stop

    from grtool.store.outputs import file_record
    from grtool.vocab.provenance import sidecar_path

    if not sidecar_path(directory).is_file() and not file_record(directory).is_file():
        require_input(directory)  # a file whose record is there (an export, a report) is judged by it, there or not
    if reason is not None and not accept:
        raise InputError("--reason goes with --accept")
    if accept:
        for stage, stop in accept_tree(directory, reason):
            console.print(f"accepted: {printable(stage)}: {describe_stop(stop)}", highlight=False, markup=False, soft_wrap=True)
    reports = validate_tree(directory, accept_empty)
    if not reports:
        raise InputError(f"{directory}: no stage directory here")
    bad = [r for r in reports if not r.ok]
    if as_json:  # names that are not UTF-8 shown as \xff, in JSON and on the terminal
        typer.echo(orjson.dumps({"ok": not bad, "stages": [r.printable() for r in reports]}).decode())
    else:
        print_verdicts(reports)
        problems = sum(len(r.problems) for r in reports)
        console.print(f"{len(reports) - len(bad)} ok, {len(bad)} with problems ({problems} problem{'s' * (problems != 1)})", highlight=False)
    if bad:
        raise typer.Exit(EXIT_DATA)


def print_verdicts(reports: list) -> None:
    """validate's verdicts on stderr: ok or FAIL and what was checked, then one line per problem and note (the lines
    `report` and `show` print too for what fails)."""
    from grtool.log import console
    from grtool.audit.validate import describe

    for r in reports:
        s = r.printable()
        mark = "[green]ok[/]" if r.ok else "[red]FAIL[/]"
        console.print(f"{mark} {escape(s['path'])} ({escape(printable(describe(r)))})", soft_wrap=True)
        for p in s["problems"]:  # one line each, unwrapped: easy to grep in a CI log
            console.print(f"    - {p}", highlight=False, markup=False, soft_wrap=True)
        for n in s["notes"]:
            console.print(f"    note: {n}", highlight=False, markup=False, soft_wrap=True)


register(Command("validate", validate_cmd, reads={"directory": PathKind.RUN, "accept_empty": PathKind.STAGE}))
