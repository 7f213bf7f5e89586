"""Run a pipeline file: each stage is its own grtool command, run in this process, skipped when done.

A stage is done when its completion record (``{out}/_pipeline/<stage>.json``, written after the command
succeeded) names the same command line and the same input fingerprints, and every output it lists still
exists; stage directories among the outputs must also be complete. A stage whose inputs changed since it ran
(an edited file, an upstream stage run again) is run again with ``--overwrite``; the plan shows the stages
that will be remade because a stage before them runs. A stage whose command changed runs as that command
would: it resumes or refuses its existing output, unless ``pipeline run --overwrite STAGE`` says to replace it.
``--overwrite`` is never part of the recorded command. Inside a stage, resume is the stage directory's own
(finished shards skipped).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from grtool.errors import GrtoolError, InputError
from grtool.pipeline.config import Pipeline, Stage
from grtool.pipeline.records import RECORDS_DIR, StageDone, read_stage_done
from grtool.pipeline.registry import PathKind, StageCommands
from grtool.records import to_builtins
from grtool.store.records import now
from grtool.store.records import atomic_write_bytes, dumps
from grtool.store.fingerprints import fingerprint
from grtool.store.stage import merge_counters
from grtool.store.status import find_stage_dirs, status


@dataclass
class StageState:
    stage: Stage
    state: str  # "done" | "partial" | "to run" | "changed" | "inputs changed" | "outputs changed" | "stale"
    detail: str = ""


def _record_path(pipeline: Pipeline, stage: Stage) -> Path:
    return Path(pipeline.out) / RECORDS_DIR / f"{stage.name}.json"


def stage_dirs(stage: Stage) -> list[Path]:
    """The stage directories among a stage's outputs (an output may be a run directory holding several)."""
    return _stage_dirs(stage.outputs)


def _stage_dirs(outputs: list[str]) -> list[Path]:
    dirs: list[Path] = []
    for o in outputs:
        p = Path(o)
        if p.is_dir():
            dirs += find_stage_dirs(p)
    return dirs


def input_paths(stage: Stage) -> list[str]:
    """Existing files and directories among a stage's arguments and option values, outputs excepted."""
    outputs = [Path(o) for o in stage.outputs]
    values = [*stage.args, *(v for value in stage.options.values() for v in (value if isinstance(value, list) else [value]))]
    paths = []
    for v in values:
        if not isinstance(v, str) or v in ("", "-"):
            continue
        p = Path(v)
        if p.exists() and not any(p == o or o in p.parents for o in outputs):
            paths.append(v)
    return list(dict.fromkeys(paths))


def declared_writes(commands: StageCommands, stage: Stage) -> list[tuple[str, str, bool]]:
    """``(flag, path, a single file)`` of what a stage writes: every option its command declares it writes
    (``out``, ``report``, ``plot``, ``trec_run``, ...), its ``stdout`` file and the other ``outputs`` it names."""
    declaration = commands.declared(stage.run)
    values = commands.values(stage.run, stage.args, stage.options)  # an option written among the args too
    found = []
    for name, kind in declaration.writes.items() if declaration is not None else ():
        value = values.get(name)
        if isinstance(value, str) and value not in ("", "-"):
            found.append((f"stage {stage.name!r} option {name}", value, kind is PathKind.REPORT))
    for name, path in declaration.files_beside(values) if declaration is not None else ():
        found.append((f"stage {stage.name!r} option {name} (the file beside it)", path, True))
    if stage.stdout:
        found.append((f"stage {stage.name!r} stdout", stage.stdout, True))
    named = [path for _, path, _ in found]
    return found + [(f"stage {stage.name!r} output", o, False) for o in stage.outputs if o not in named]


def refuse_writes_over_inputs(commands: StageCommands, pipeline: Pipeline, extra: dict[str, str | None] | None = None) -> None:
    """Exit 2 when anything a stage writes (its output, a report, its ``stdout``) or an ``extra`` file such as
    ``--json`` is, or lies inside, what a stage reads that no earlier stage writes (the user's data: a raw file, a
    stage made outside the pipeline) or the pipeline file; when it is a record or lies in ``_pipeline/``; or when two
    stages write the same path. Reading an earlier stage's report (``eval compare``) stays fine."""
    from grtool.store.outputs import refuse_output_among_inputs, refuse_overlapping_outputs, refuse_record_path

    external: list[str] = [str(pipeline.path)]
    written: list[str] = []
    targets: list[tuple[str, str, str]] = []  # (stage, flag, path)
    stage_dirs: dict[Path, str] = {}  # the stage directories the stages before write -> the option that writes it
    for stage in pipeline.stages:
        writes = declared_writes(commands, stage)
        own = [path for _, path, _ in writes]
        external += [p for p in input_paths(stage) if p not in own and not any(_overlaps(p, o) for o in written)]
        written += own
        targets += [(stage.name, flag, path) for flag, path, _ in writes]
        if stage.stdout:  # its command checks its own outputs against each other, but never sees its stdout file
            stdout_flag = f"stage {stage.name!r} stdout"
            for flag, target, _ in writes:
                if flag != stdout_flag:
                    refuse_overlapping_outputs([(stdout_flag, stage.stdout), (flag, target)], by=f"pipeline {pipeline.path}")
        for flag, target, _ in writes:
            refuse_record_path(target, flag, within=[o for o in own if o != target])
            at = Path(os.path.abspath(target))
            inside = next((d for d in stage_dirs if d == at or d in at.parents), None)
            if inside is not None:  # a stage directory holds only what its own command writes there
                where = "is" if inside == at else "lies inside"
                raise InputError(f"{pipeline.path}: {flag} {target}: {where} {inside}, a stage directory {stage_dirs[inside]} writes; write it somewhere else")
        for d, _, _ in written_tables(commands, stage):
            d = Path(os.path.abspath(d))
            stage_dirs[d] = next((f for f, p, _ in writes if Path(os.path.abspath(p)) in (d, d.parent)), f"stage {stage.name!r}")
    # A command whose output is a run directory writes its stage directories inside it (OUT/triples, OUT/documents
    # and OUT/questions), where later stages write theirs too.
    run_dirs = {o for stage in pipeline.stages if commands.writes_run_directory(stage.run) for o in stage.outputs}
    for flag, target in [*((flag, path) for _, flag, path in targets), *(extra or {}).items()]:
        if target:  # as the commands check --out: a file or a stage read is never written, a folder read never contains it
            refuse_output_among_inputs(target, holders=external, flag=flag)
    for i, (name, flag, target) in enumerate(targets):  # two stages never write the same path, nor one inside the other's
        for other_name, other_flag, other in targets[i + 1 :]:
            if other_name == name:
                continue  # one stage's own outputs: its command checks them against each other
            if target in run_dirs or other in run_dirs:  # a run directory holds other stages: only the same path collides
                if Path(target).resolve() == Path(other).resolve():
                    refuse_overlapping_outputs([(flag, target), (other_flag, other)], by=f"pipeline {pipeline.path}")
                continue
            refuse_overlapping_outputs([(flag, target), (other_flag, other)], by=f"pipeline {pipeline.path}")
    for flag, target in (extra or {}).items():  # the run's own files never meet what a stage writes
        if target:
            refuse_record_path(target, flag)
            for _, stage_flag, output in targets:
                refuse_overlapping_outputs([(flag, target), (stage_flag, output)], by=f"pipeline {pipeline.path}")


def input_fingerprints(stage: Stage) -> dict[str, Any]:
    """What the stage read: stage directories by their shard checksums, other files by size and content samples."""
    found: dict[str, Any] = {}
    for path in input_paths(stage):
        dirs = _stage_dirs([path])
        found[path] = [fingerprint(d) for d in dirs] if dirs else fingerprint(path)
    return found


def output_file_fingerprints(stage: Stage) -> dict[str, Any]:
    """The outputs that are files (reports, exports, the stdout file) by their content: a done stage whose file was
    cut short or edited is not done."""
    return {path: fingerprint(path) for path in stage.outputs if Path(path).is_file()}


def _overlaps(a: str, b: str) -> bool:
    pa_, pb = Path(a).resolve(), Path(b).resolve()
    return pa_ == pb or pa_ in pb.parents or pb in pa_.parents


def stage_state(pipeline: Pipeline, stage: Stage) -> StageState:
    record = _record_path(pipeline, stage)
    dirs = _stage_dirs(stage.outputs)
    statuses = [status(d) for d in dirs]
    if record.exists():
        saved = read_stage_done(record)
        if saved.command != stage.identity():
            return StageState(stage, "changed", "the command differs from the one that made the outputs")
        missing = [o for o in stage.outputs if not Path(o).exists()]
        if missing:
            return StageState(stage, "to run", f"missing {', '.join(missing)}")
        if saved.files is not None:
            current_files, recorded_files = output_file_fingerprints(stage), to_builtins(saved.files)
            edited = [p for p in sorted(recorded_files) if current_files.get(p) != recorded_files[p]]
            if edited:
                return StageState(stage, "outputs changed", f"{', '.join(edited)} changed since the stage wrote it: it runs again, "
                                  "and refuses a file edited by hand, which is yours (move it away first)")  # fmt: skip
        if saved.inputs is not None:
            current, recorded = input_fingerprints(stage), to_builtins(saved.inputs)
            # an older grtool fingerprinted a stage's report or plot as its input: it is its output now
            recorded = {p: f for p, f in recorded.items() if p not in stage.outputs}
            changed = [p for p in sorted(set(current) | set(recorded)) if current.get(p) != recorded.get(p)]
            if changed:
                return StageState(stage, "inputs changed", f"{', '.join(changed)} changed since it ran; runs again with --overwrite")
        if all(s["complete"] for s in statuses):
            return StageState(stage, "done")
    if statuses and any(s["parts_done"] for s in statuses):
        done = sum(s["parts_done"] for s in statuses)
        planned = sum(s["parts_planned"] or 0 for s in statuses)
        return StageState(stage, "partial", f"{done}/{planned} parts done")
    return StageState(stage, "to run")


def plan(pipeline: Pipeline, stages: list[Stage]) -> list[StageState]:
    """Each stage's state; a done stage that reads what an earlier stage of the plan will remake is stale."""
    states: list[StageState] = []
    remade: dict[str, str] = {}  # output path -> the stage that will write it in this run
    for stage in stages:
        state = stage_state(pipeline, stage)
        if state.state == "done":
            upstream = next(((p, remade[o]) for p in input_paths(stage) for o in remade if _overlaps(p, o)), None)
            if upstream is not None:
                state = StageState(stage, "stale", f"{upstream[0]} is remade by stage {upstream[1]} first")
        if state.state != "done":
            remade.update({o: stage.name for o in stage.outputs})
        states.append(state)
    return states


def accepts_overwrite(commands: StageCommands, stage: Stage) -> bool:
    """Whether the stage's command has an --overwrite option (report commands simply rewrite their output)."""
    return commands.accepts(stage.run, "overwrite")


def require_extras(commands: StageCommands, stages: list[Stage]) -> None:
    """Every extra the stages' commands need is installed, checked before the first stage runs (a missing one
    would otherwise stop the pipeline halfway, after the stages before it wrote their outputs)."""
    from grtool.extras import require

    for stage in stages:
        for extra, feature in commands.extras(stage.run, stage.args, stage.options):
            require(extra, f"stage {stage.name!r}: {feature}")


def check_overwrite_names(commands: StageCommands, pipeline: Pipeline, names: list[str]) -> set[str]:
    """``pipeline run --overwrite STAGE``: each a stage of the pipeline whose command has ``--overwrite``."""
    stages = {s.name: s for s in pipeline.stages}
    for name in names:
        if name not in stages:
            raise InputError(f"--overwrite {name}: {pipeline.path} has no stage named {name!r} (stages: {', '.join(stages)})")
        if not accepts_overwrite(commands, stages[name]):
            raise InputError(f"--overwrite {name}: the stage's command ({stages[name].run}) has no --overwrite; it rewrites its output on every run")
    return set(names)


def check_stage_arguments(commands: StageCommands, pipeline: Pipeline, stages: list[Stage], overwrite: set[str]) -> None:
    """Each stage's options converted to its command's typed options (choices, numbers and their bounds, unknown
    options) and checked as the command checks them, before any stage runs: a mistake in the last stage is found
    before the first one writes anything."""
    for stage in stages:
        options = {**stage.options, "overwrite": True} if stage.name in overwrite and accepts_overwrite(commands, stage) else stage.options
        where = f"{pipeline.path}: stage {stage.name!r}"
        try:
            commands.check_arguments(stage.run, stage.args, options, where)
        except InputError as e:  # a value a --set gave is blamed on that --set, not on the file
            said = next((by for (name, key), by in pipeline.set_by.items() if name == stage.name and f"--{key.replace('_', '-')}" in str(e)), None)
            if said is None or not str(e).startswith(where):
                raise
            raise InputError(f"{said} ({where}){str(e)[len(where) :]}") from None


def check_input_paths(commands: StageCommands, pipeline: Pipeline, states: list[StageState]) -> None:
    """Every file or directory a stage that will run names for reading exists now or is an output of a stage before
    it, checked before the first stage runs: a wrong ``--deepspeed`` in the last stage is found now, not when the
    jobs reach it. Relative paths are resolved from the working directory, where the stages (and the Slurm jobs,
    ``--chdir``) run."""
    cwd = Path.cwd()
    made: list[Path] = []
    selected = [state.stage for state in states]
    for state in states:
        stage = state.stage
        if state.state != "done":
            for label, value in commands.input_paths(stage.run, stage.args, stage.options):
                path = Path(os.path.abspath(cwd / value))
                if path.exists() or any(path == o or o in path.parents or path in o.parents for o in made):
                    continue
                writer = next((s.name for s in pipeline.stages if s not in selected and any(_overlaps(value, o) for o in s.outputs)), None)
                if writer is not None:  # --from/--until left out the stage that makes it
                    raise InputError(f"{pipeline.path}: stage {stage.name!r}, {label}: {value} does not exist yet; stage {writer!r} writes it, "
                                     f"and this run does not include it (--from/--until)")  # fmt: skip
                raise InputError(f"{pipeline.path}: stage {stage.name!r}, {label}: {value} does not exist and no stage before it writes it "
                                 f"(relative paths are resolved from {cwd}, where the stages run)")  # fmt: skip
        made += [Path(os.path.abspath(cwd / o)) for o in stage.outputs]
    check_input_tables(commands, pipeline, states)
    from grtool.store.outputs import check_file_output, refuse_foreign_directory

    for state in states:  # for a stage that will run (a done one's outputs are not written again):
        if state.state == "done":
            continue
        if state.stage.stdout:  # a stdout file is absent or grtool's
            check_file_output(state.stage.stdout, f"{pipeline.path}: stage {state.stage.name!r} stdout")
        # An index or a checkpoint holds nothing of the user's (its command refuses one that does, with or without
        # --overwrite); a stage directory may (a README beside its parts), as may a run directory.
        declaration = commands.declared(state.stage.run)
        if declaration is not None:
            values = commands.values(state.stage.run, state.stage.args, state.stage.options)
            for name, kind in declaration.writes.items():
                if kind is PathKind.DIRECTORY and isinstance(values.get(name), (str, os.PathLike)):
                    refuse_foreign_directory(values[name], f"{pipeline.path}: stage {state.stage.name!r} option {name}")


def written_tables(commands: StageCommands, stage: Stage) -> list[tuple[str, str, bool]]:
    """``(stage directory, table, inside a run directory)`` for each stage directory the stage's command declares
    it writes."""
    declaration = commands.declared(stage.run)
    if declaration is None:
        return []
    values = commands.values(stage.run, stage.args, stage.options)
    return [(directory, table, name in declaration.run_tables)
            for name in declaration.writes for value in [values.get(name)] if isinstance(value, str) and value not in ("", "-")
            for directory, table in declaration.written_tables(name, value)]  # fmt: skip


def check_input_tables(commands: StageCommands, pipeline: Pipeline, states: list[StageState]) -> None:
    """Every stage table a stage that will run reads (``--chains``, ``--corpus``: the tables its command declares)
    is where it looks, checked before the first stage runs: a stage directory a stage before it writes must be of
    that table, and a run directory one writes must get a stage of it inside (``--chains {out}/triples`` is refused
    now, not when the stage starts hours later); a directory made outside the pipeline, or by a stage this run
    leaves out (``--from``/``--until``), is checked on disk as the command will check it."""
    cwd = Path.cwd()
    selected = {state.stage.name: state.state for state in states}
    before = _Written()
    for stage in pipeline.stages:
        if stage.name not in selected:
            continue  # left out of this run: what it made, if it ever ran, is on disk
        if selected[stage.name] != "done":
            for label, value, tables in commands.input_tables(stage.run, stage.args, stage.options):
                for table in tables:
                    try:
                        before.check(Path(os.path.abspath(cwd / value)), table)
                    except GrtoolError as e:  # the same error (its type and exit code), naming the stage and option
                        e.args = (f"{pipeline.path}: stage {stage.name!r}, {label} {value}: {e}",)
                        raise
        before.add(commands, stage, cwd)


@dataclass
class _Written:
    """What the stages before a stage write, as their commands declare it."""

    made: dict[Path, tuple[str, str]] = field(default_factory=dict)  # a stage directory -> (its table, the stage)
    runs: dict[Path, str] = field(default_factory=dict)  # a run directory whose stage directories are declared -> the stage
    others: dict[Path, str] = field(default_factory=dict)  # another directory (an index, a checkpoint) -> the stage
    outputs: list[Path] = field(default_factory=list)  # everything they write
    unknown: list[Path] = field(default_factory=list)  # what they write without declaring its tables

    def add(self, commands: StageCommands, stage: Stage, cwd: Path) -> None:
        def absolute(value: Any) -> Path:
            return Path(os.path.abspath(cwd / str(value)))

        self.outputs += [absolute(o) for o in stage.outputs]
        for directory, table, in_run in written_tables(commands, stage):
            self.made[absolute(directory)] = (table, stage.name)
            if in_run:
                self.runs[absolute(directory).parent] = stage.name
        declaration = commands.declared(stage.run)
        values = commands.values(stage.run, stage.args, stage.options)  # options given among the args too
        for name, kind in declaration.writes.items() if declaration is not None else ():
            if kind is PathKind.DIRECTORY and isinstance(values.get(name), str):
                self.others[absolute(values[name])] = stage.name
        known = {*self.made, *self.runs, *self.others}
        self.unknown += [o for o in map(absolute, stage.outputs) if o not in known]

    def check(self, path: Path, table: str) -> None:
        from grtool.store.records import resolve_stage

        inside = path / table
        if self.made.get(path, ("",))[0] == table or self.made.get(inside, ("",))[0] == table:
            return
        if path in self.made:
            got, writer = self.made[path]
            raise InputError(f"stage {writer!r} writes a stage directory of table {got!r} there, and this command reads {table!r} "
                             f"(at that path or in {table}/ inside it)")  # fmt: skip
        if path in self.others:
            raise InputError(f"stage {self.others[path]!r} writes a directory there that holds no stage tables (an index or a "
                             f"checkpoint), and this command reads a stage directory of table {table!r}")  # fmt: skip
        if path in self.runs:
            if inside in self.runs:
                raise InputError(f"stage {self.runs[inside]!r} writes a run directory at {inside}, not a stage directory of table {table!r}")
            if not any(o == inside or inside in o.parents or o in inside.parents for o in self.unknown) and not _holds(inside, table):
                held = ", ".join(f"{d.name}/ ({t}, stage {s!r})" for d, (t, s) in self.made.items() if d.parent == path) or "no stage directory"
                raise InputError(f"no stage before this one writes a stage directory of table {table!r} there or at {inside} "
                                 f"(stage {self.runs[path]!r} writes a run directory there; the stages before put in it: {held})")  # fmt: skip
        if path.is_dir() and not any(path == o or o in path.parents or path in o.parents for o in self.outputs):
            resolve_stage(path, table)  # made outside the pipeline: as the command will resolve it


def _holds(path: Path, table: str) -> bool:
    """Whether ``path`` is, on disk now, a stage directory of ``table`` (a damaged record there is an error)."""
    from grtool.store.records import is_stage_dir, load_manifest

    return is_stage_dir(path) and load_manifest(path).table == table


def runs_with_overwrite(commands: StageCommands, state: StageState, overwrite: set[str]) -> bool:
    """Whether a stage that is not done runs with ``--overwrite``: its inputs changed since it ran, or the
    user named it (``pipeline run --overwrite STAGE``)."""
    return (state.state in ("inputs changed", "outputs changed") or state.stage.name in overwrite) and accepts_overwrite(commands, state.stage)


def run_stage(commands: StageCommands, stage: Stage, *, overwrite: bool = False) -> float:
    """Run one stage's command in this process; returns seconds taken. Raises GrtoolError on failure."""
    from grtool.invocation import command
    from grtool.log import flags
    from grtool.store.frames import recording
    from grtool.store.partloop import claim_file

    argv = stage.argv(overwrite)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # The stage records its own equivalent command line (the one the plan prints), not `grtool pipeline run`:
        # in its outputs, its stdout file's record and the locks it holds.
        stack.enter_context(command(["grtool", *argv]))
        claimed = stack.enter_context(claim_file(stage.stdout, f"stage {stage.name!r} stdout", stdout=True, redirect=True))
        if claimed is not None:  # a failed stage keeps the earlier file: the claim moves it in only when the block succeeds
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(claimed.open())))
        try:
            with recording() as outcome:  # the stage's own outcome in its manifests (the error is re-worded below)
                code = commands.invoke(flags() + argv)  # --quiet/--verbose carry over
                outcome.returned(code)
        except GrtoolError as e:
            raise GrtoolError(f"stage {stage.name!r} failed: {e}", e.exit_code) from None
        if isinstance(code, int) and code != 0:
            raise GrtoolError(f"stage {stage.name!r} failed with exit code {code}: {stage.command_line(overwrite)}", code)
    return time.perf_counter() - start


def mark_done(out: str | Path, stage: Stage, seconds: float) -> None:
    """The stage's completion record: its command and what it read, written once its command succeeded."""
    record = Path(out) / RECORDS_DIR / f"{stage.name}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    done = msgspec.convert({"stage": stage.name, "command": stage.identity(), "outputs": stage.outputs, "inputs": input_fingerprints(stage),
                            "files": output_file_fingerprints(stage), "seconds": round(max(seconds, 0.0), 3), "finished": now()}, StageDone)  # fmt: skip
    atomic_write_bytes(record, dumps(to_builtins(done)))  # written as it is read back: through its declaration


def summarize(stages: list[Stage]) -> list[dict[str, Any]]:
    """Rows and rejects per stage, from the manifests of the stage directories among its outputs."""
    rows = []
    for stage in stages:
        dirs = _stage_dirs(stage.outputs)
        statuses = [status(d) for d in dirs]
        counters = merge_counters(s["counters"] for s in statuses)
        rows.append(
            {
                "stage": stage.name,
                "tables": {str(s["path"]): s["rows"] for s in statuses},
                "rows": sum(s["rows"] for s in statuses),
                "rejected": counters["rejected"],
                "extra": counters.get("extra", {}),
                "outputs": stage.outputs,
            }
        )
    return rows
