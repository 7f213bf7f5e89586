"""The Slurm executor: each stage that is not done becomes one sbatch job running its exact ``grtool …`` line.

- A stage with ``slurm = { tasks = N }`` is a job array of N tasks; each task is one shard of the stage
  (grtool reads ``SLURM_ARRAY_TASK_COUNT``/``SLURM_ARRAY_TASK_ID`` as ``--num-shards/--shard-index``).
- Jobs are chained with ``--dependency=afterok:`` along the stages' data dependencies (a stage waits for the
  stages whose outputs it reads), so independent stages run side by side; ``--kill-on-invalid-dep=yes`` cancels
  what can no longer run after a failure.
- A stage's completion record (``OUT/_pipeline/STAGE.json``, the same the local executor writes) is written by
  ``grtool pipeline finalize`` at the end of its job. After an array it is a small job of its own, afterok on the
  whole array: it starts once, after the last task ended, and merges the shard records into each manifest alone,
  so the merge cannot race a task (the tasks' own merges under the manifest lock need a file system with
  ``flock``; this one does not).
- A stage of more tasks than the cluster's ``MaxArraySize`` (``scontrol show config``; Slurm's default 1001
  when it does not say) is several arrays, each covering a contiguous range of shards: the script passes
  ``--num-shards N --shard-index $((SLURM_ARRAY_TASK_ID + offset))`` explicitly. The finalize job waits for all
  of them; with ``parallel`` each array also waits for the one before it, so the limit holds across them.
- Every ``[slurm]`` value was checked at load against the shape Slurm accepts for its key
  (:mod:`grtool.pipeline.slurm_values`); words on ``#SBATCH`` lines are quoted the way Slurm reads them, the
  script's commands with ``shlex``; a string with a control character never reaches a script.
- sbatch's answer must be a job id; anything else stops the run naming the stage (nothing waits on it).
- The jobs' scripts and records are in ``OUT/_pipeline/slurm/``, their logs in ``OUT/_pipeline/logs/``
  (``STAGE-%A_%a.out`` for an array task, ``STAGE-%j.out`` for a single job).
- ``#SBATCH --signal=TERM@120`` stops grtool two minutes before the time limit (exit 75, resumable) and the job
  requeues itself; ``scancel`` does not requeue (the batch shell dies with the job).
- Re-running submits only the stages that are not done and not already queued or running.
"""

from __future__ import annotations

import datetime as _dt
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from grtool.errors import EXIT_DATA, DataProblem, GrtoolError, InputError, TransientError, printable
from grtool.log import log
from grtool.pipeline.config import Pipeline, Stage
from grtool.pipeline.executors import PipelineExecutor, print_summary
from grtool.pipeline.records import Jobs, SlurmJobRecord, StageTable, read_slurm_job
from grtool.pipeline.slurm_values import control_character, sbatch_word, shown, time_minutes
from grtool.pipeline.runner import RECORDS_DIR, StageState, check_input_paths, mark_done, stage_dirs
from grtool.records import to_builtins
from grtool.store.records import now
from grtool.store.layout import TMP_SUFFIX
from grtool.store.records import atomic_write_bytes, dumps

JOBS_DIR = "slurm"
LOGS_DIR = "logs"
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUE_HOLD", "REQUEUE_FED",
          "SIGNALING", "STAGE_OUT", "STOPPED"}  # fmt: skip
RETRYABLE = {"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"}  # ended from outside: resumable
MAX_REQUEUES = 5  # a stage that keeps exiting 75 (a server down) stops requeueing itself after this many
POLL_SECONDS = 2.0
DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize: array indexes 0-1000
_STAGE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}", re.ASCII)  # a job name and a file name
_JOB_ID = re.compile(r"([0-9]{1,18})(?:;[A-Za-z0-9_.\-]{1,128})?", re.ASCII)  # sbatch --parsable: id[;cluster]


def settings(pipeline: Pipeline, stage: Stage) -> dict[str, Any]:
    """The stage's job settings: the ``[slurm]`` defaults with the stage's own ``slurm = {…}`` over them."""
    return {**pipeline.slurm, **stage.slurm}


def depends_on(stage: Stage, earlier: list[Stage]) -> list[str]:
    """The earlier stages whose outputs this stage reads (any argument or option value at or inside one of their
    outputs, or holding one), whether or not those paths exist yet."""
    values = [*stage.args, *(v for value in stage.options.values() for v in (value if isinstance(value, list) else [value]))]
    paths = [Path(v).absolute() for v in values if isinstance(v, str) and v not in ("", "-")]
    own = [Path(o).absolute() for o in stage.outputs]
    found = []
    for other in earlier:
        outs = [Path(o).absolute() for o in other.outputs]
        for p in paths:
            if any(p == o for o in own):
                continue
            if any(p == o or o in p.parents or p in o.parents for o in outs):
                found.append(other.name)
                break
    return found


def _say(text: str, end: str = "\n") -> None:
    """A line (or a script) of the dry run on stdout, a control character from a path escaped in each line (it could
    colour or rewrite the terminal; a stage's own strings hold none, _check_script_text)."""
    from grtool.userinput import controls_escaped

    sys.stdout.write("\n".join(controls_escaped(line) for line in text.split("\n")) + end)


class SlurmExecutor(PipelineExecutor):
    def __init__(self, pipeline: Pipeline, commands, stages: list[Stage], overwrite: set[str] | None = None, *, wait: bool = False,
                 check_env: bool = True):  # fmt: skip
        super().__init__(pipeline, commands, stages, overwrite)
        self.wait = wait
        self.check_env = check_env
        self.out = Path(pipeline.out)
        self.jobs_dir = self.out / RECORDS_DIR / JOBS_DIR
        self.logs_dir = self.out / RECORDS_DIR / LOGS_DIR
        self.cwd = Path.cwd()

    # ---- what to submit

    def _todo(self) -> list[tuple[StageState, dict[str, Any], list[str]]]:
        """Each stage that is not done, its settings and the earlier stages of the run it waits for; checked."""
        todo = []
        running: list[Stage] = []
        states = self.plan()
        check_input_paths(self.commands, self.pipeline, states)
        for state in states:
            stage = state.stage
            if state.state == "done":
                continue
            conf = settings(self.pipeline, stage)
            self._check(state, conf)
            todo.append((state, conf, depends_on(stage, running)))
            running.append(stage)
        if self.check_env:
            self._check_environments(todo)
        return todo

    def _check_environments(self, todo: list[tuple[StageState, dict[str, Any], list[str]]]) -> None:
        """The packages each stage's command needs (``--backend vllm``: vllm) import in its job's environment,
        tried the way the job will run: its setup line, then ``python`` (one shell per setup line, every
        package of its stages at once). The local executor's check looks at this process only; a job runs
        wherever its setup line leads."""
        from grtool.extras import EXTRAS

        needs: dict[str, list[tuple[Stage, str, str, str, str]]] = {}  # setup line -> (stage, feature, extra, module, package)
        for state, conf, _ in todo:
            stage = state.stage
            for extra, feature in self.commands.extras(stage.run, stage.args, stage.options):
                needs.setdefault(conf.get("setup") or "", []).extend((stage, feature, extra, module, package) for module, package in EXTRAS[extra])
        problems, extras = [], []
        for setup, wanted in needs.items():
            failed = import_failures(setup, sorted({module for *_, module, _ in wanted}), self.cwd)
            how = f"after its setup line {shown(setup, 200)}" if setup else "(no setup line: the environment of this command)"
            missing: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (stage, feature) -> (package, why) that did not import
            for stage, feature, extra, module, package in wanted:
                if module in failed:
                    missing.setdefault((stage.name, feature), []).append((package, failed[module]))
                    extras += [extra] if extra not in extras else []
            for (name, feature), gone in missing.items():
                packages = f"the Python package {gone[0][0]}, which does" if len(gone) == 1 else f"the Python packages {', '.join(p for p, _ in gone)}, which do"
                problems.append(f"stage {name!r} ({feature}) needs {packages} not import in its job's environment {how}: {gone[0][1]}")
        if problems:
            install = " ".join(f"'grtool[{e}]'" for e in extras)
            raise InputError(f"{self.pipeline.path}: {'; '.join(problems)}; install in that environment (pip install {install}) or change slurm.setup "
                             f"(--no-check-env skips this check)")  # fmt: skip

    def _overwrite(self, state: StageState) -> bool:
        # A done stage whose input an earlier stage remakes ("stale") will find its inputs changed when it runs.
        changed = state.state in ("inputs changed", "outputs changed", "stale") or state.stage.name in self.overwrite
        return changed and self.commands.accepts(state.stage.run, "overwrite")

    def _check(self, state: StageState, conf: dict[str, Any]) -> None:
        stage = state.stage
        where = f"{self.pipeline.path}: stage {stage.name!r}, slurm"
        if "tasks" in self.pipeline.slurm:
            raise InputError(f"{self.pipeline.path}: [slurm] tasks: set tasks per stage (slurm = {{ tasks = N }}), not for every stage")
        self._check_script_text(stage)
        tasks = conf.get("tasks", 1)
        if tasks > 1:
            if not self.commands.shards(stage.run):
                raise InputError(f"{where} 'tasks': {stage.run} does not split its work into shards (no --num-shards); run it as one job (tasks = 1)")
            if {"num_shards", "shard_index"} & set(self.commands.values(stage.run, stage.args, stage.options)):  # args too
                raise InputError(f"{where} 'tasks': the stage sets --num-shards/--shard-index itself; an array task takes them from Slurm")
            if stage.stdout:
                raise InputError(f"{where} 'tasks': a stage with stdout = FILE runs as one job (its tasks would each write the report)")
            if self._overwrite(state):
                raise InputError(f"{where} 'tasks': the stage must replace its output (--overwrite: {state.state}), which an array's tasks "
                                 f"cannot do together; run it once with --set {stage.name}.slurm.tasks=1, or locally")  # fmt: skip
        elif "parallel" in conf:
            raise InputError(f"{where} 'parallel': only for an array (tasks > 1)")
        if tasks > 1 and self.max_array_size()[0] < 1:
            raise InputError(f"{where} 'tasks': this cluster has job arrays turned off (MaxArraySize = 0); set tasks = 1")

    def _check_script_text(self, stage: Stage) -> None:
        """Every string of ``stage`` that its batch script carries: no control character (a newline would end an
        ``#SBATCH`` line or a comment early), and a stage name fit for a job name and a file name."""
        where = f"{self.pipeline.path}: stage {stage.name!r}"
        if not _STAGE_NAME.fullmatch(stage.name):
            raise InputError(f"{where}: the name {shown(stage.name)} cannot name a Slurm job and its files; "
                             f"expected letters, digits, '_', '.', '-' (at most 128)")  # fmt: skip
        values = [(f"option {k!r}", v) for k, value in stage.options.items() for v in (value if isinstance(value, list) else [value])]
        texts = [("key 'run'", stage.run), *(("key 'args'", a) for a in stage.args), *values, *(("key 'outputs'", o) for o in stage.outputs),
                 ("key 'stdout'", stage.stdout), ("out", str(self.out)), ("the working directory", str(self.cwd))]  # fmt: skip
        for what, text in texts:
            bad = control_character(text) if isinstance(text, str) else None
            if bad:
                raise InputError(f"{where}, {what}: {shown(text, 200)} holds the control character '{bad}', which a Slurm job's script cannot carry")

    def max_array_size(self) -> tuple[int, str]:
        """The cluster's MaxArraySize and where it came from (asked once per run)."""
        if getattr(self, "_max_array", None) is None:
            self._max_array = max_array_size()
        return self._max_array

    def arrays(self, conf: dict[str, Any]) -> list[tuple[int, int]]:
        """The stage's arrays as (first shard, task count): one array unless the tasks pass MaxArraySize."""
        tasks, size = conf.get("tasks", 1), max(self.max_array_size()[0], 1)
        return [(start, min(size, tasks - start)) for start in range(0, tasks, size)]

    # ---- the batch scripts

    def _directives(self, stage: Stage, conf: dict[str, Any], *, array: int | None) -> list[str]:
        """The ``#SBATCH`` arguments (unquoted); ``array``: the task count of this array, None for one job."""
        log_name = f"{stage.name}-%A_%a.out" if array else f"{stage.name}-%j.out"
        lines = [f"--job-name=grtool-{stage.name}", f"--output={self._log_pattern(log_name)}", "--open-mode=append",
                 f"--chdir={self.cwd}", "--requeue", "--signal=TERM@120"]  # fmt: skip
        flags = {"partition": "--partition", "account": "--account", "qos": "--qos", "time": "--time", "nodes": "--nodes",
                 "cpus": "--cpus-per-task", "mem": "--mem", "gres": "--gres"}  # fmt: skip
        lines += [f"{flag}={conf[key]}" for key, flag in flags.items() if conf.get(key) is not None]
        if array:
            lines.append(f"--array=0-{array - 1}" + (f"%{conf['parallel']}" if conf.get("parallel") else ""))
        lines += list(conf.get("sbatch", []))
        return lines

    def _log_pattern(self, name: str) -> str:
        """--output's file name pattern: the logs folder with any '%' doubled (Slurm would read it as a field)."""
        return str(self.logs_dir.absolute()).replace("%", "%%") + "/" + name

    def _record_path(self, stage: Stage) -> Path:
        return self.jobs_dir / f"{stage.name}.json"

    def _script_path(self, stage: Stage, index: int = 0) -> Path:
        return self.jobs_dir / (f"{stage.name}.sbatch" if index == 0 else f"{stage.name}.array{index}.sbatch")

    def stage_script(self, state: StageState, conf: dict[str, Any], chunk: tuple[int, int] | None = None) -> str:
        """The job of a stage; ``chunk`` (first shard, task count): one array of an array stage (the first one
        when not given)."""
        stage = state.stage
        tasks = conf.get("tasks", 1)
        array = tasks > 1
        overwrite = self._overwrite(state)
        line = shlex.join(["grtool", *stage.argv(overwrite)])
        if array:  # each task one shard: the array's index, moved by where this array starts
            first, count = chunk or self.arrays(conf)[0]
            index = '"$SLURM_ARRAY_TASK_ID"' if first == 0 else f'"$((SLURM_ARRAY_TASK_ID + {first}))"'
            line += f" --num-shards {tasks} --shard-index {index}"
        if conf.get("launch"):  # words, each quoted: never shell syntax
            line = f"{shlex.join(shlex.split(conf['launch']))} {line}"
        record = shlex.quote(str(self._record_path(stage).absolute()))
        body = [_comment(f"stage {stage.name}: {state.state}" + (f" ({state.detail})" if state.detail else "")),
                _comment(f"outputs: {', '.join(stage.outputs) or '-'}")]  # fmt: skip
        if array:
            body.append(_comment(f"shards {_shard_range(first, count)} of {tasks}"))
        body += _setup_then_strict(conf, "set -uo pipefail")
        srun = shlex.join(srun_words(conf))
        if stage.stdout:  # replaced only when the command succeeds: a failed run keeps the earlier report
            tmp = shlex.quote(f"{stage.stdout}.slurm-") + '"$SLURM_JOB_ID"' + shlex.quote(TMP_SUFFIX)
            body += [f"mkdir -p {shlex.quote(str(Path(stage.stdout).parent))}", f"{srun} {line} > {tmp}"]
        else:
            body.append(f"{srun} {line}")
        # An array task requeues itself by ARRAY_TASK: one task's SLURM_JOB_ID is the array's own id, and
        # `scontrol requeue <that id>` would requeue every task of the array, finished and running ones too.
        me = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' if array else '"$SLURM_JOB_ID"'
        body += [
            "rc=$?",
            "# 75: stopped by SIGTERM (the time limit's warning, --signal) or a transient failure: requeue, the stage resumes",
            f'if [ "$rc" -eq 75 ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {MAX_REQUEUES} ]; then scontrol requeue {me}; fi',
        ]
        if stage.stdout:
            body.append(f'if [ "$rc" -ne 0 ]; then rm -f {tmp}; exit "$rc"; fi')
        else:
            body.append('if [ "$rc" -ne 0 ]; then exit "$rc"; fi')
        if not array:  # finalize puts the stdout file in place as a local run does: checked, its record, then renamed
            body.append(f"grtool pipeline finalize {record}" + (f" --stdout-from {tmp}" if stage.stdout else ""))
        return _script(self._directives(stage, conf, array=count if array else None), body)

    def finalize_script(self, stage: Stage, conf: dict[str, Any]) -> str:
        """After an array: one job, afterok on every task, that merges the manifests and records the stage done.
        It needs one CPU and no GPU: after a GPU array it runs where the ``[slurm]`` defaults send a job (the CPU
        partition, with their account and QOS), since a GPU partition may refuse or long queue a job without a GPU;
        on the stage's own partition when the defaults name none, or when the stage asks for no GPU."""
        place = self.pipeline.slurm if gpus_per_task(conf.get("gres")) and self.pipeline.slurm.get("partition") else conf
        keep = {k: place[k] for k in ("partition", "account", "qos") if place.get(k)}
        directives = self._directives(stage, {**keep, "time": "01:00:00", "cpus": 1}, array=None)
        directives[0] += "-finalize"
        directives[1] = f"--output={self._log_pattern(f'{stage.name}-finalize-%j.out')}"
        body = [*_setup_then_strict(conf, "set -euo pipefail"),
                f"grtool pipeline finalize --merge {shlex.quote(str(self._record_path(stage).absolute()))}"]  # fmt: skip
        return _script(directives, body)

    # ---- dry run

    def dry_run(self) -> None:
        todo = self._todo()
        _say(f"# jobs to submit (relative paths are resolved from {self.cwd}, the jobs' --chdir):")
        arrays = {state.stage.name: len(self.arrays(conf)) for state, conf, _ in todo if conf.get("tasks", 1) > 1}
        for line in job_table([(state.stage.name, conf) for state, conf, _ in todo], arrays):
            _say(f"#   {line}")
        if any(conf.get("tasks", 1) > 1 for _, conf, _ in todo):
            size, source = self.max_array_size()
            _say(f"# MaxArraySize {size} ({source}): a stage of more tasks is submitted as several arrays")
        for state, conf, after in todo:
            stage = state.stage
            tasks = conf.get("tasks", 1)
            chunks = self.arrays(conf) if tasks > 1 else [(0, 1)]
            for n, (first, count) in enumerate(chunks):
                what = f" (array {n + 1} of {len(chunks)}: shards {_shard_range(first, count)})" if len(chunks) > 1 else ""
                what = what or (f" (array of {tasks} tasks)" if tasks > 1 else "")
                _say(f"# ---- {self._script_path(stage, n)}{what}")
                _say(self.stage_script(state, conf, (first, count)), end="")
            if tasks > 1:
                _say(f"# ---- {self.jobs_dir / (stage.name + '.finalize.sbatch')} (after every task of {stage.name})")
                _say(self.finalize_script(stage, conf), end="")
        _say("# dependency graph (sbatch --dependency=afterok:…):")
        for state in self.plan():
            stage = state.stage
            entry = next((t for t in todo if t[0].stage is stage), None)
            if entry is None:
                _say(f"#   {stage.name}: {state.state}, not submitted")
                continue
            _, conf, after = entry
            _say(f"#   {stage.name} ({self._job_kind(stage, conf)})" + (f" after {', '.join(after)}" if after else ""))
        _say(f"# {len(todo)} of {len(self.stages)} stages to submit" + (f": {', '.join(t[0].stage.name for t in todo)}" if todo else ""))
        sys.stdout.flush()

    def _job_kind(self, stage: Stage, conf: dict[str, Any]) -> str:
        if conf.get("tasks", 1) == 1:
            return "one job"
        chunks = self.arrays(conf)
        if len(chunks) == 1:
            return f"array 0-{conf['tasks'] - 1}, then {stage.name}-finalize"
        ranges = ", ".join(_shard_range(first, count) for first, count in chunks)
        parallel = f", one after another (parallel = {conf['parallel']})" if conf.get("parallel") else ""
        return f"{len(chunks)} arrays: shards {ranges} (MaxArraySize {self.max_array_size()[0]}){parallel}, then {stage.name}-finalize"

    # ---- submission

    def run(self) -> list[dict[str, Any]] | None:
        todo = self._todo()
        if not todo:
            log.info("every stage is done: nothing to submit")
            return print_summary(self.stages) if self.wait else None
        if shutil.which("sbatch") is None:
            raise InputError("--executor slurm: no sbatch on PATH (run it on a Slurm login node, or use --executor local)")
        scripts = {state.stage.name: [self.stage_script(state, conf, chunk) for chunk in (self.arrays(conf) if conf.get("tasks", 1) > 1 else [(0, 1)])]
                   for state, conf, _ in todo}  # fmt: skip
        queued = {state.stage.name: self._active_job(state.stage) for state, _, _ in todo}
        for name, stage_scripts in scripts.items():  # sbatch checks every job (partition, gres, time, ...) before one is submitted
            if queued[name] is None:
                _sbatch(["--test-only"], stage_scripts[0], f"stage {name!r}", test_only=True)
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        final: dict[str, str] = {}  # stage -> the job its dependents wait for
        for state, conf, after in todo:
            stage = state.stage
            if queued[stage.name] is not None:
                final[stage.name] = queued[stage.name]
                log.info("stage %s: already queued or running as job %s, not submitted again", stage.name, queued[stage.name])
                continue
            deps = [final[a] for a in after if a in final]
            # built from its declaration, the one truth of what finalize_stage reads back (read_slurm_job)
            record = SlurmJobRecord(stage=StageTable(**stage.to_dict()), out=str(self.out.absolute()), overwrite=self._overwrite(state),
                                    tasks=conf.get("tasks", 1), submitted=now())  # fmt: skip
            atomic_write_bytes(self._record_path(stage), dumps(to_builtins(record)))  # before the job starts: its last step reads it
            arrays: list[str] = []
            try:
                for n, script in enumerate(scripts[stage.name]):
                    script_path = self._script_path(stage, n)
                    script_path.write_text(script)
                    # With `parallel`, an array waits for the one before it: the limit holds across the stage's arrays.
                    wait_for = arrays[-1:] if conf.get("parallel") else []
                    arrays.append(_sbatch(["--parsable", *_dependency(deps, after_any=wait_for), str(script_path)], None, f"stage {stage.name!r}"))
                record.jobs = Jobs(run=arrays[0], arrays=arrays if len(arrays) > 1 else [])
                final[stage.name] = arrays[0]
                if conf.get("tasks", 1) > 1:
                    fin_path = self.jobs_dir / f"{stage.name}.finalize.sbatch"
                    fin_path.write_text(self.finalize_script(stage, conf))
                    fin = _sbatch(["--parsable", *_dependency(arrays), str(fin_path)], None, f"stage {stage.name!r}")
                    record.jobs = Jobs(run=record.jobs.run, arrays=record.jobs.arrays, finalize=fin)
                    final[stage.name] = fin
            except GrtoolError:
                if arrays:  # a stage half submitted is not recorded: a rerun submits it whole, so its jobs go
                    try:
                        subprocess.run(["scancel", *arrays], capture_output=True)
                    except OSError:
                        pass  # no scancel: the warning below names the jobs to cancel
                    log.warning("stage %s: cancelled its jobs %s, submitted before sbatch failed", stage.name, ", ".join(arrays))
                raise
            atomic_write_bytes(self._record_path(stage), dumps(to_builtins(record)))
            after_text = f" after {', '.join(a for a in after if a in final)}" if after else ""
            tasks = conf.get("tasks", 1)
            what = "" if tasks == 1 else f" (array of {tasks} tasks)" if len(arrays) == 1 else f" (arrays of {tasks} tasks: jobs {', '.join(arrays)})"
            log.info("stage %s: submitted job %s%s%s", stage.name, arrays[0], what, after_text)
        if not self.wait:
            return None
        self._wait([name for name in final])
        return print_summary(self.stages)

    def _active_job(self, stage: Stage) -> str | None:
        """The job this stage's dependents would wait for when a previous run's job of it is still queued or running."""
        path = self._record_path(stage)
        if not path.exists():
            return None
        jobs = to_builtins(read_slurm_job(path).jobs)
        ids = job_ids(jobs)
        if not ids:
            return None
        try:
            states = job_states(ids)
        except ControllerUnreachable as e:
            raise ControllerUnreachable(f"stage {stage.name!r}: cannot tell whether its last jobs ({', '.join(ids)}) still run; {e}; nothing was submitted") from None
        if any(s["state"] in ACTIVE and s.get("reason") != "DependencyNeverSatisfied" for s in states.values()):
            return jobs.get("finalize") or jobs.get("run")
        return None

    def _wait(self, names: list[str]) -> None:
        """Until every job of ``names`` ended; raise naming each job that did not complete and its log."""
        records = {n: read_slurm_job(self._record_path(s)) for n in names for s in self.stages if s.name == n}
        ids = {n: job_ids(to_builtins(r.jobs)) for n, r in records.items()}
        all_ids = [j for js in ids.values() for j in js]
        unknown_since = time.monotonic()
        while True:
            try:
                states, down = job_states(all_ids), None
            except ControllerUnreachable as e:  # a controller restarting: asked again until the same limit
                states, down = {}, e
            pending = [k for k, s in states.items() if s["state"] in ACTIVE and s.get("reason") != "DependencyNeverSatisfied"]
            if states and not pending:
                break
            if states:
                unknown_since = time.monotonic()
            elif time.monotonic() - unknown_since > 120:  # Slurm forgot the jobs and no jobcomp file names them
                if down is not None:
                    raise ControllerUnreachable(f"--wait: {down}; the jobs go on: see grtool status {self.out}")
                raise GrtoolError(f"--wait: Slurm no longer knows jobs {', '.join(all_ids)} (no squeue/scontrol record, no jobcomp file); "
                                  f"see {self.logs_dir} and grtool status {self.out}", 75)  # fmt: skip
            time.sleep(POLL_SECONDS)
        failed = []
        for name, stage_ids in ids.items():
            try:
                states = job_states(stage_ids)
            except ControllerUnreachable as e:
                raise ControllerUnreachable(f"--wait: every job ended, but {e}; see grtool status {self.out}") from None
            for key, s in sorted(states.items()):
                if s["state"] != "COMPLETED":
                    failed.append((name, key, s))
        if not failed:
            log.info("every job completed")
            return
        first = [f for f in failed if f[2].get("reason") not in ("DependencyNeverSatisfied", "Dependency")] or failed
        lines = [f"stage {name}: job {key} {s['state']}" + (f" (exit {s['exit']})" if s.get("exit") not in (None, "0:0") else "")
                 + f", log {s.get('log') or self.logs_dir / (name + '-' + key + '.out')}" for name, key, s in first]  # fmt: skip
        rest = sorted({name for name, _, _ in failed} - {name for name, _, _ in first})
        message = "; ".join(lines) + (f"; not run: {', '.join(rest)}" if rest else "")
        if all(s["state"] in RETRYABLE for _, _, s in first):
            raise GrtoolError(f"pipeline jobs ended early: {message}; run the same command again to resume", 75)
        raise DataProblem(f"pipeline jobs failed: {message}")


def job_ids(jobs: dict[str, Any]) -> list[str]:
    """Every job of a stage's record: its arrays (or its one job), then its finalize job."""
    return [*_run_jobs(jobs), *([jobs["finalize"]] if jobs.get("finalize") else [])]


def _run_jobs(jobs: dict[str, Any]) -> list[str]:
    """The jobs that run a stage's work: its arrays (a stage split past MaxArraySize), or its one job."""
    return jobs.get("arrays") or ([jobs["run"]] if jobs.get("run") else [])


def job_label(jobs: dict[str, Any]) -> str:
    """A stage's jobs as status shows them: its job, or every array of a stage split past MaxArraySize, and its
    finalize job ("12, 13 (finalize 14)")."""
    return (", ".join(_run_jobs(jobs)) or "-") + (f" (finalize {jobs['finalize']})" if jobs.get("finalize") else "")


def time_hours(text: str | None) -> float | None:
    """A Slurm ``--time`` (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) in hours; None
    when unset, unlimited or unreadable (the partition's limit applies, which the plan cannot know)."""
    minutes = time_minutes(str(text).strip()) if text else None
    return minutes / 60 if minutes is not None and minutes != float("inf") else None


def max_array_size() -> tuple[int, str]:
    """The cluster's ``MaxArraySize`` (an array's indexes are 0 to MaxArraySize - 1) and where it came from:
    ``scontrol show config``, else Slurm's default 1001."""
    try:
        proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        proc = None
    m = re.search(r"^MaxArraySize\s*=\s*([0-9]{1,8})\s*$", proc.stdout, re.M | re.ASCII) if proc and proc.returncode == 0 else None
    if m and int(m[1]) <= 4_000_001:
        return int(m[1]), "scontrol show config"
    return DEFAULT_MAX_ARRAY_SIZE, "Slurm's default: scontrol show config did not say"


# Run by the job environment's `python`: one line per module, "ok" or why it did not import.
_IMPORT_CHECK = """import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print(name, "ok", sep="\\t", flush=True)
    except BaseException as e:
        print(name, type(e).__name__ + ": " + " ".join(str(e).split())[:300], sep="\\t", flush=True)
"""
IMPORT_TIMEOUT = 600  # seconds: vllm and torch import slowly from a cold network file system


def import_failures(setup: str, modules: list[str], cwd: Path) -> dict[str, str]:
    """``{module: why}`` for each of ``modules`` that does not import in a job's environment: ``setup`` (a shell
    line) run by bash in ``cwd``, then ``python`` importing each; without a setup line, this process's own
    interpreter (the job inherits the submitting environment). A module the check never reached (no
    ``python`` after the setup line, a crash) fails with the shell's last words."""
    argv = ["bash", "-c", f"{setup}\npython -c {shlex.quote(_IMPORT_CHECK)} {shlex.join(modules)}"] if setup else [sys.executable, "-c", _IMPORT_CHECK, *modules]
    try:
        proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=IMPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {m: f"importing it took more than {IMPORT_TIMEOUT} s" for m in modules}
    said = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if line.count("\t") == 1)
    last = " ".join((proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1].split())[:300]
    return {m: said.get(m, f"not tried ({last})") for m in modules if said.get(m) != "ok"}


def _shard_range(first: int, count: int) -> str:
    return f"{first}-{first + count - 1}" if count > 1 else str(first)


def _dependency(after_ok: list[str], after_any: list[str] | None = None) -> list[str]:
    """sbatch's dependency arguments: every job of ``after_ok`` completed, every job of ``after_any`` ended."""
    parts = ([f"afterok:{':'.join(after_ok)}"] if after_ok else []) + ([f"afterany:{':'.join(after_any)}"] if after_any else [])
    return [f"--dependency={','.join(parts)}", "--kill-on-invalid-dep=yes"] if parts else []


def _setup_then_strict(conf: dict[str, Any], strict: str) -> list[str]:
    """The job's setup line, then the shell's strict mode (``set -u`` …): activation scripts (conda's, module
    files) read variables that may be unset and would stop the job under ``set -u``."""
    return [*([conf["setup"]] if conf.get("setup") else []), strict]


def srun_words(conf: dict[str, Any]) -> list[str]:
    """``srun`` and its arguments for a stage's step: the job's ``--cpus-per-task`` (Slurm 22.05 to 23.02 gives a
    step one CPU unless told; later versions take it from the job, so saying it is always right), then the stage's
    own ``srun`` arguments."""
    return ["srun", *([f"--cpus-per-task={conf['cpus']}"] if conf.get("cpus") else []), *conf.get("srun", [])]


def _comment(text: str) -> str:
    """A comment line of a script: one line whatever ``text`` holds (a control character is escaped)."""
    return "# " + "".join(repr(ch)[1:-1] if control_character(ch) else ch for ch in text)


def gpus_per_task(gres: str | None) -> int:
    """GPUs in a ``--gres`` value: ``gpu:4``, ``gpu:h100:4`` → 4, ``gpu`` → 1; other resources count 0."""
    total = 0
    for item in (gres or "").split(","):
        words = item.strip().split(":")
        if words[0] == "gpu":
            total += int(words[-1]) if len(words) > 1 and words[-1].isdigit() else 1
    return total


def job_table(jobs: list[tuple[str, dict[str, Any]]], arrays: dict[str, int] | None = None) -> list[str]:
    """One line per stage's job (partition, gres, tasks and the arrays they are split into past MaxArraySize,
    cpus, mem, time, GPU-hours at most) and a total: what a submission asks of the cluster, before its scripts."""
    header = ["stage", "partition", "gres", "tasks", "cpus", "mem", "time", "max GPU-hours"]
    rows, total, unknown = [], 0.0, False
    for name, conf in jobs:
        tasks, nodes = conf.get("tasks", 1), conf.get("nodes", 1)
        gpus, hours = gpus_per_task(conf.get("gres")) * nodes, time_hours(conf.get("time"))
        if gpus and hours is None:
            unknown = True
        gpu_hours = gpus * tasks * hours if hours is not None else None
        total += gpu_hours or 0
        shown = "0" if not gpus else f"{gpu_hours:g}" if gpu_hours is not None else "? (no time)"
        split = (arrays or {}).get(name, 1)
        rows.append([name, conf.get("partition") or "(default)", conf.get("gres") or "-", f"{tasks} ({split} arrays)" if split > 1 else str(tasks),
                     str(conf.get("cpus") or "-"),
                     conf.get("mem") or "-", conf.get("time") or "(default)", shown])  # fmt: skip
    rows.append(["total", "", "", "", "", "", "", f"{total:g}" + ("+?" if unknown else "")])
    return columns(header, rows)


def columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """Plain aligned text lines (no table borders: the lines stay readable in a log and easy to grep)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def _script(directives: list[str], body: list[str]) -> str:
    # Each directive one word as Slurm reads #SBATCH lines: a path with spaces or quotes stays one argument.
    return "\n".join(["#!/bin/bash", *(f"#SBATCH {sbatch_word(d)}" for d in directives), *body]) + "\n"


def _sbatch(args: list[str], script: str | None, what: str, *, test_only: bool = False) -> str:
    """Run sbatch (the script on stdin when given); the job id it printed (``--parsable``: ``ID`` or
    ``ID;CLUSTER``; or ``Submitted batch job ID``), or an error naming ``what``. Nothing else is taken for an id:
    a later job would wait on it."""
    proc = subprocess.run(["sbatch", *args], input=script, capture_output=True, text=True)
    if proc.returncode != 0:
        said = " ".join((proc.stderr or proc.stdout).split()) or f"exit {proc.returncode}"
        raise InputError(f"--executor slurm: sbatch refused the job of {what}: {said}")
    if test_only:
        return ""
    answer = proc.stdout.strip()
    m = _JOB_ID.fullmatch(answer.removeprefix("Submitted batch job "))
    if not m:
        raise GrtoolError(f"--executor slurm: sbatch answered {shown(answer, 200)} for the job of {what}, which is not a job id "
                          f"(expected ID or ID;CLUSTER); no job waits on it, later stages were not submitted", EXIT_DATA)  # fmt: skip
    return m[1]


# ---- job states: squeue/scontrol while Slurm remembers the job, then the jobcomp file (sacct needs slurmdbd)


CONTROLLER_DOWN = "Unable to contact slurm controller"  # what scontrol says after waiting out Slurm's message timeout


class ControllerUnreachable(TransientError):
    """scontrol could not reach slurmctld. Each call waits out Slurm's message timeout first (18 s with the
    defaults), so the jobs after the first are not asked about: `status` of a run with several stages took a
    minute to say nothing."""


def job_states(ids: list[str]) -> dict[str, dict[str, Any]]:
    """``{"123": {...}, "124_0": {...}}``: each job (each array task) of ``ids`` with its state, reason, exit code, log.
    Raises :class:`ControllerUnreachable` when scontrol cannot reach the controller."""
    found: dict[str, dict[str, Any]] = {}
    missing = []
    for job in ids:
        proc = subprocess.run(["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True)
        if proc.returncode != 0 and CONTROLLER_DOWN in proc.stderr:
            raise ControllerUnreachable(f"Slurm: {proc.stderr.strip().splitlines()[-1]}")
        rows = [_fields(line) for line in proc.stdout.splitlines() if line.startswith("JobId=")] if proc.returncode == 0 else []
        if not rows:
            missing.append(str(job))
        for f in rows:
            found[_key(f)] = {"state": f.get("JobState", "?"), "reason": f.get("Reason"), "exit": f.get("ExitCode"), "log": f.get("StdOut")}
    if missing:
        for f in _jobcomp():
            if f.get("JobId") in missing or f.get("ArrayJobId") in missing:
                found[_key(f)] = {"state": f.get("JobState", "?"), "reason": None, "exit": f.get("ExitCode"), "log": None}
    return found


def _key(f: dict[str, str]) -> str:
    task = f.get("ArrayTaskId")
    return f"{f['ArrayJobId']}_{task}" if task and f.get("ArrayJobId") else f.get("JobId", "?")


def _fields(line: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", line))


def _jobcomp() -> list[dict[str, str]]:
    """The records of finished jobs in the jobcomp file (JobCompType=jobcomp/filetxt), when readable."""
    proc = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True)
    m = re.search(r"^JobCompLoc\s*=\s*(\S+)", proc.stdout, re.M)
    kind = re.search(r"^JobCompType\s*=\s*(\S+)", proc.stdout, re.M)
    if not m or not kind or "filetxt" not in kind[1]:
        return []
    try:
        return [_fields(line) for line in Path(m[1]).read_text(errors="replace").splitlines()]
    except OSError:
        return []


def slurm_jobs(out: str | Path) -> list[dict[str, Any]]:
    """Per stage of the run directory ``out``: its last submitted jobs and their states (``grtool status``)."""
    rows = []
    folder = Path(out) / RECORDS_DIR / JOBS_DIR
    if not folder.is_dir():
        return rows
    have_slurm = shutil.which("scontrol") is not None
    down = None  # scontrol's answer once it could not reach the controller: the other stages are not asked
    for path in sorted(folder.glob("*.json")):
        record = read_slurm_job(path)  # a damaged one is one line naming it, not a stage left out of the table
        jobs = to_builtins(record.jobs)
        ids = job_ids(jobs)
        try:
            states = job_states(ids) if have_slurm and ids and not down else {}
        except ControllerUnreachable as e:
            states, down = {}, str(e)
        counts: dict[str, int] = {}
        for s in states.values():
            counts[s["state"]] = counts.get(s["state"], 0) + 1
        name = record.stage.name
        failed = [{"job": key, "state": s["state"], "exit": s.get("exit"), "log": s.get("log") or str(_log_path(Path(out), name, key, jobs))}
                  for key, s in sorted(states.items()) if s["state"] not in ACTIVE and s["state"] != "COMPLETED"]  # fmt: skip
        rows.append({"stage": name, "jobs": jobs, "tasks": record.tasks, "submitted": record.submitted,
                     "states": {k: v["state"] for k, v in states.items()}, "failed": failed,
                     "summary": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or _unknown(have_slurm, down)})  # fmt: skip
    return rows


def _unknown(have_slurm: bool, down: str | None) -> str:
    if not have_slurm:
        return "unknown (no scontrol here)"
    return f"unknown ({down})" if down else "unknown"


def _log_path(out: Path, stage: str, key: str, jobs: dict[str, str]) -> Path:
    """Where a job's output went (the --output patterns of the scripts), for a job Slurm no longer describes."""
    logs = (out / RECORDS_DIR / LOGS_DIR).absolute()
    return logs / (f"{stage}-finalize-{key}.out" if key == jobs.get("finalize") else f"{stage}-{key}.out")


# ---- the last step of a stage's job


def _install_stdout(stage: Stage, finished: Path) -> None:
    """The job's stdout put in place as a local run puts it (its claim checked and held, the stage's command in its
    record); refused, it stays where the job wrote it, and the message says where."""
    from grtool.invocation import command
    from grtool.store.partloop import claim_file

    try:
        with command(["grtool", *stage.argv()]), claim_file(stage.stdout, f"stage {stage.name!r} stdout", redirect=True) as claimed:
            claimed.install(finished)
    except InputError as e:
        raise InputError(f"{e}; the job's output is kept in {printable(finished)}") from None


def finalize_stage(record_path: str | Path, *, merge: bool = False, stdout_from: str | Path | None = None) -> None:
    """Check a stage's outputs are complete after its job and write its completion record; ``merge``: merge the
    shard records into each manifest first (once, after an array's last task); ``stdout_from``: the job's stdout,
    put in place of the stage's ``stdout`` file."""
    from grtool.store.stage import merge_shard_records
    from grtool.store.status import status

    path = Path(record_path)
    try:
        record = read_slurm_job(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such stage's job record") from None
    stage = Stage.from_dict(to_builtins(record.stage))
    dirs = stage_dirs(stage)
    if merge:
        for d in dirs:
            merge_shard_records(d)
    for d in dirs:
        s = status(d)
        if not s["complete"]:
            raise DataProblem(f"stage {stage.name!r}: {d} is not complete after its job ({s['parts_done']}/{s['parts_planned']} parts done; see grtool status {d})")
    if stage.stdout and stdout_from is not None:
        _install_stdout(stage, Path(stdout_from))
    missing = [o for o in stage.outputs if not Path(o).exists()]
    if missing:
        raise DataProblem(f"stage {stage.name!r}: its job left no {', '.join(missing)}")
    if stage.stdout and stdout_from is None and Path(stage.stdout).is_file():  # a job script of an earlier grtool moved it in
        from grtool.secrets import redact_argv
        from grtool.store.outputs import write_file_record

        write_file_record(Path(stage.stdout), redact_argv(["grtool", *stage.argv()]), stdout=True)
    submitted = _dt.datetime.fromisoformat(record.submitted)
    if submitted.tzinfo is None:
        submitted = submitted.replace(tzinfo=_dt.timezone.utc)
    mark_done(record.out, stage, (_dt.datetime.now(_dt.timezone.utc) - submitted).total_seconds())
    log.info("stage %s: done", stage.name)
