"""The records a pipeline run keeps in ``OUT/_pipeline/``, declared once (:mod:`grtool.records`) and read back
through these declarations only: a damaged one is one line naming the file and the field (exit 1), never a
traceback or a stage taken for done.

- ``_pipeline/STAGE.json``: a stage's completion record (its command, outputs, what it read), written by
  :func:`grtool.pipeline.runner.mark_done` once its command succeeded;
- ``_pipeline/slurm/STAGE.json``: the jobs a Slurm run submitted for the stage (:mod:`grtool.pipeline.slurm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from grtool.records import DamagedRecord, Seconds, check_timestamp, read_record
from grtool.store.sharding import MAX_ARRAY_TASKS
from grtool.store.records import InputRecord, Text

RECORDS_DIR = "_pipeline"  # OUT/_pipeline: the run's records (stage completions, Slurm jobs and logs)

# What sbatch --parsable prints before any ";cluster": the job's number.
JobId = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,20}$")]
Tasks = Annotated[int, msgspec.Meta(ge=1, le=MAX_ARRAY_TASKS)]


class StageDone(msgspec.Struct):
    """``_pipeline/STAGE.json``: the stage's command line, its outputs, its inputs' fingerprints, how long it took."""

    stage: Text
    command: Text
    outputs: list[Text]
    seconds: Seconds
    finished: Text
    # by input path: a stage directory's fingerprint, or a list of them for a run directory holding several
    inputs: dict[Text, InputRecord | list[InputRecord]] | None = None
    # by output path: the fingerprint of each output that is a file (a report, an export, the stdout file); stage
    # directories are checked by their own records, indexes by theirs
    files: dict[Text, InputRecord] | None = None

    def __post_init__(self) -> None:
        check_timestamp(self.finished, "finished")


class StageTable(msgspec.Struct):
    """A stage as a Slurm job's record keeps it (:meth:`grtool.pipeline.config.Stage.to_dict`)."""

    name: Text
    run: Text
    args: list[Text]
    options: list[tuple[Text, Any]]
    outputs: list[Text]
    stdout: Text | None
    slurm: dict[Text, Any]


class Jobs(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The jobs submitted: the (first) array, every array when the stage needed several, the finalize job."""

    run: JobId | None = None
    arrays: list[JobId] = []
    finalize: JobId | None = None

    def __post_init__(self) -> None:
        if self.arrays and self.run != self.arrays[0]:
            raise ValueError(f"field run: {self.run!r} is not the first of the arrays {self.arrays}")


class SlurmJobRecord(msgspec.Struct):
    """``_pipeline/slurm/STAGE.json``: the stage, the run directory, and the jobs submitted for it."""

    stage: StageTable
    out: Text
    submitted: Text
    overwrite: bool = False
    tasks: Tasks = 1
    jobs: Jobs = msgspec.field(default_factory=Jobs)

    def __post_init__(self) -> None:
        check_timestamp(self.submitted, "submitted")
        if self.jobs.finalize is not None and self.jobs.run is None:
            raise ValueError("field jobs: a finalize job without the run job it follows")


def _named_after(path: Path, name: str, field: str, what: str) -> None:
    if name != path.stem:
        raise DamagedRecord(f"{path}: {what}: field {field}: {name!r} is not {path.stem!r}, the stage it is named after (edited or damaged)")


def read_stage_done(path: str | Path) -> StageDone:
    """A stage's completion record (``FileNotFoundError`` when there is none)."""
    p = Path(path)
    record = read_record(p, StageDone, what="stage completion record")
    _named_after(p, record.stage, "stage", "stage completion record")
    return record


def read_slurm_job(path: str | Path) -> SlurmJobRecord:
    """A stage's Slurm job record (``FileNotFoundError`` when there is none)."""
    p = Path(path)
    record = read_record(p, SlurmJobRecord, what="Slurm job record")
    _named_after(p, record.stage.name, "stage.name", "Slurm job record")
    return record
