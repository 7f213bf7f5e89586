"""The part loop every sharded stage shares: a stage supplies *what one part does*, :class:`PartLoop` the rest.

- **sharding**: ``--num-shards/--shard-index`` resolved once (defaults: the Slurm array variables), the output
  writers opened as that task (:class:`~grtool.store.stage.StageWriter` locks, shard records);
- **skipping**: a part is finished when every output has it (its record names a file on disk as committed);
  a finished part is not redone; where only some outputs have it, the part runs and writes the others;
- **progress**: one bar, counting parts (each advanced when committed) or the stage's own units;
- **timing**: each shard record gets the part's wall ``seconds`` and written ``rows_per_second``
  (:class:`~grtool.store.stage.ShardWriter` measures from the part's opening to its commit);
- **stopping early**: a part may ask that no further part starts (a guard tripped); it is committed first.

The model stages add the backend, the request cache and the empty-output guard on top
(:class:`grtool.llm.stage_runner.ModelStage`); the others (``corpus ingest|merge|split``, the evidence triples,
``filters apply``, ``chains gold``, ``retrieve --backend bm25``) call :meth:`PartLoop.run` with their part
function. Outputs may have part counts of their own (``corpus split``: the questions' parts and the documents').

A file written whole (an export: :class:`FileOutput`) is an output of one part: claimed when the loop opens, written
to a temporary name, and, when its part ends, its record first and then the file renamed into place. A directory
built whole (an index: :class:`DirectoryOutput`) is built in a temporary directory beside it and installed when its
part ends; one written in place as it goes (a checkpoint: :class:`InPlaceOutput`) is only claimed and recorded.
:func:`one_part` runs such outputs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, BinaryIO, ClassVar, TypeVar

from grtool.log import progress
from grtool.store.diskfull import writing
from grtool.store.io import is_stdio, open_output
from grtool.store.layout import part_name
from grtool.store.paths import empty_directory
from grtool import signals
from grtool.errors import GrtoolError, InputError, printable
from grtool.store.outputs import EXPORT, FILE, Claim, OutputKind, changed_meanwhile, claim, remove_killed_scratch, replacing, write_file_record, written_by_grtool
from grtool.store.sharding import parts_for_task, resolve_sharding
from grtool.store.records import Manifest
from grtool.store.stage import StageSpec


@dataclass
class Output:
    """One stage directory the stage writes (``path`` ``-``: JSON Lines on stdout); ``finish`` goes into its manifest.
    ``num_parts``: its own count of parts (None: the loop's), for a stage whose outputs are split differently (`corpus
    split` copies the documents part for part beside the questions): part ``i`` of the loop writes only the outputs
    that have a part ``i``."""

    path: str | Path
    spec: StageSpec
    finish: dict[str, Any] = field(default_factory=dict)
    num_parts: int | None = None
    tag: str | None = None  # on stdout: ``"_table": tag`` in every row (a command that streams two tables)

    def open(self, *, overwrite: bool, num_parts: int, shards: tuple[int, int]) -> Any:
        return open_output(self.path, self.spec, overwrite=overwrite, num_parts=num_parts, tag=self.tag, shards=shards)


class WholeOutput:
    """What :class:`PartLoop` reads of an output written whole by one part (:class:`FileOutput`,
    :class:`DirectoryOutput`, :class:`InPlaceOutput`): one part, nothing added to a manifest."""

    num_parts: ClassVar[int] = 1
    finish: ClassVar[Mapping[str, Any]] = MappingProxyType({})


@dataclass
class FileOutput(WholeOutput):
    """One file written whole (``-``: standard output), claimed as ``kind`` when it is opened, before any work
    (:func:`grtool.store.outputs.claim`: checked against ``inputs``, the stages read, and ``holders``, the paths
    given; locked). An export is its command's one part (:func:`one_part`): the part writes its :class:`FilePart`'s
    ``handle`` and sets its ``record``, which writes the file's record from the finished temporary file. A report,
    plot or JSON file (:data:`~grtool.store.outputs.FILE`) is claimed for the whole command by :func:`claim_file`
    and written once its result is known (:meth:`FileWriter.write`)."""

    path: str | Path
    kind: OutputKind = EXPORT
    export_kind: str | None = None
    inputs: Sequence[str | Path | None] = ()
    holders: Sequence[str | Path | None] = ()
    flag: str = "--out"
    redirect: bool = False  # the file holds the command's standard output (a pipeline stage's stdout)

    def open(self, *, overwrite: bool, num_parts: int, shards: tuple[int, int]) -> "FileWriter":
        return FileWriter(self)


@dataclass
class FilePart:
    """What a part writes for a :class:`FileOutput`: ``handle`` (binary), and ``record``, set by the part before it
    returns: ``record(content=tmp)`` writes the record of the file whose finished bytes are at ``tmp``."""

    handle: BinaryIO
    record: Callable[..., object] | None = None


class WholeWriter:
    """A :class:`WholeOutput` opened: its claim (None: standard output) held until :meth:`finish`, or until the
    writer is dropped; its one part is written on every run (its command keeps an up-to-date output before the
    loop claims it), and judges its own result before it is put in place."""

    claim: Claim | None = None

    def hold(self, claimed: Claim) -> Claim:
        self.claim = claimed
        weakref.finalize(self, claimed.release)
        return claimed

    def done(self, index: int) -> bool:
        return False

    def finish(self, *, check_empty: bool = True, **extra: Any) -> None:
        if self.claim is not None:
            self.claim.release()

    def check_empty(self, manifest: None) -> None:
        """Applied by the part itself, before its output is put in place."""


_CLAIMED: set[str] = set()  # the files this process holds a claim of (resolved): one claim each at a time


class FileWriter(WholeWriter):
    """A :class:`FileOutput` opened."""

    def __init__(self, output: FileOutput):
        self.output = output
        self.path = Path(output.path)
        self.stdout = is_stdio(output.path)
        self.state = "not written"  # then "recorded" (its new record in, the file not yet), then "written"
        self.real = os.path.realpath(self.path)  # where the path's links lead: one claim of it at a time
        self.made = [] if self.stdout else [d for d in Path(self.real).parents if not os.path.lexists(d)]  # by the lock
        self.unclaim: Callable[[], Any] = lambda: None
        if not self.stdout:
            if self.real in _CLAIMED:  # the lock lets this process in again (a pipeline's stages in turn): not twice at once
                raise InputError(f"{output.flag} {printable(self.path)}: this run writes it already, as another of its outputs; give each output its own path")
            try:
                self.hold(claim(output.path, output.kind, inputs=output.inputs, holders=output.holders, export_kind=output.export_kind, flag=output.flag))
            except BaseException:
                self._remove_made()
                raise
            _CLAIMED.add(self.real)
            self.unclaim = weakref.finalize(self, _CLAIMED.discard, self.real)  # once: at finish, or when dropped
            remove_killed_scratch(self.path, [*output.inputs, *output.holders])
            signals.track(self)

    def finish(self, *, check_empty: bool = True, **extra: Any) -> None:
        """The claim let go; a run that wrote nothing leaves no folder it made for the file's lock."""
        super().finish()
        self.unclaim()
        if self.state == "not written":
            self._remove_made()

    def _remove_made(self) -> None:
        for folder in self.made:  # deepest first; one holding anything stops it
            try:
                folder.rmdir()
            except OSError:
                break

    def on_stop(self) -> str:
        """What a stop left of the file, for the line the run prints when a signal stops it."""
        if self.state == "recorded":
            return f"{printable(self.output.path)}: its new record is written and the file is not (grtool validate names it; the same command writes both)"
        if self.state == "written":
            return f"{printable(self.output.path)}: written"
        return f"{printable(self.output.path)}: not written (what was there stays as it was)"

    @contextlib.contextmanager
    def placing(self, record: Callable[[Path], object]) -> Iterator[Path]:
        """A temporary path beside the file to write it at; when the block ends, ``record(tmp)`` writes its record
        and then the file is renamed into place (:func:`replacing`)."""

        def recorded(tmp: Path) -> None:
            if os.path.lexists(self.path) and not written_by_grtool(self.path):  # put there since the claim: the user's
                raise changed_meanwhile(self.path)
            record(tmp)
            self.state = "recorded"

        with writing(self.path), replacing(self.path, recorded) as tmp:
            yield tmp
        self.state = "written"

    @contextlib.contextmanager
    def shard(self, index: int) -> Iterator[FilePart]:
        """The part's file: written to a temporary name beside it, then its record, then the rename."""
        if self.stdout:
            with writing("-"):
                yield FilePart(sys.stdout.buffer)
                sys.stdout.buffer.flush()
            return
        with self.placing(lambda tmp: self._part_record(part, tmp)) as tmp, open(tmp, "wb") as handle:
            part = FilePart(handle)
            yield part

    def _part_record(self, part: FilePart, tmp: Path) -> None:
        if part.record is None:
            raise RuntimeError(f"{self.output.path}: a part wrote {self.output.kind.what} without setting its record")
        part.record(content=tmp)

    # a report, plot or JSON file (FILE): written whole by the command, its record saying which command wrote it

    def write(self, data: bytes) -> Path:
        with self.placing(self._file_record) as tmp:
            tmp.write_bytes(data)
        return self.path

    def write_with(self, make: Callable[[Path], object]) -> Path:
        """``make(tmp)`` writes the file (a chart drawn by a library that takes a path)."""
        with self.placing(self._file_record) as tmp:
            make(tmp)
        return self.path

    def install(self, finished: Path) -> Path:
        """A file finished elsewhere beside it (a Slurm job's stdout) put in place as this claim's file."""
        with self.placing(self._file_record) as tmp:
            os.replace(finished, tmp)
        return self.path

    @contextlib.contextmanager
    def open(self, mode: str = "w") -> Iterator[IO[Any]]:
        """``with report.open() as f:`` the file written through a handle (text in UTF-8 unless ``mode`` has b)."""
        with self.placing(self._file_record) as tmp, open(tmp, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle

    def _file_record(self, tmp: Path) -> None:
        from grtool.invocation import current_command
        from grtool.secrets import redact_argv

        assert self.output.kind is FILE and self.claim is not None, "an export's part writes its own record"
        write_file_record(self.path, redact_argv(self.claim.lock.command or current_command()), content=tmp, stdout=self.output.redirect)


@contextlib.contextmanager
def claim_file(out: str | Path | None, flag: str = "--out", *, inputs: Sequence[str | Path | None] = (), holders: Sequence[str | Path | None] = (),
               stdout: bool = False, redirect: bool = False) -> Iterator[FileWriter | None]:  # fmt: skip
    """``with claim_file(path, "--report") as report:`` a report, plot or JSON file claimed before any work (checked
    as :func:`grtool.store.outputs.check_file_output` says, and locked: a second run writing it is refused at once),
    written by ``report.write(...)`` once the result is known, let go when the block ends. None for no file, or
    for ``-`` where the caller writes standard output instead (``stdout``); elsewhere ``-`` is refused, never
    silently nothing. ``redirect``: the file keeps the command's standard output (its record says so)."""
    if out is not None and str(out) == "-" and not stdout:
        raise InputError(f"{flag} -: {flag} writes a file, not standard output; name the file")
    if out is None or str(out) == "-":
        yield None
        return
    writer = FileWriter(FileOutput(out, FILE, inputs=inputs, holders=holders, flag=flag, redirect=redirect))
    try:
        yield writer
    finally:
        writer.finish()


@dataclass
class DirectoryOutput(WholeOutput):
    """A directory built whole by the stage's one part (an index), claimed as ``kind`` when the loop opens, before
    any work (:func:`grtool.store.outputs.claim`, with the loop's ``overwrite``). The part builds in the empty
    temporary directory ``scratch(path)`` makes beside it (its :class:`DirectoryPart`); when the part ends it is
    installed in place of ``path`` (:meth:`grtool.store.outputs.Claim.install`: grtool's entries replaced, the
    record last, a user's files beside them kept), and removed when the part fails."""

    path: str | Path
    kind: OutputKind
    scratch: Callable[[Path], Path]
    inputs: Sequence[str | Path | None] = ()
    holders: Sequence[str | Path | None] = ()

    def open(self, *, overwrite: bool, num_parts: int, shards: tuple[int, int]) -> "DirectoryWriter":
        return DirectoryWriter(self, overwrite)


@dataclass(frozen=True)
class DirectoryPart:
    """What a part builds for a :class:`DirectoryOutput`: the temporary directory ``path``, installed when it ends."""

    path: Path


class DirectoryWriter(WholeWriter):
    """A :class:`DirectoryOutput` opened."""

    def __init__(self, output: DirectoryOutput, overwrite: bool):
        self.output = output
        self.overwrite = overwrite
        self.hold(claim(output.path, output.kind, inputs=output.inputs, holders=output.holders, overwrite=overwrite))
        self._refuse_appeared("before this run held its lock")

    def _refuse_appeared(self, when: str) -> None:
        """Without ``overwrite`` the directory is new (or empty): one that appeared since the command checked is not
        replaced."""
        path = Path(self.output.path)
        if not self.overwrite and os.path.lexists(path) and not empty_directory(path):
            self.finish()
            raise GrtoolError(f"{printable(path)}: appeared {when}; it is left as it is: use --overwrite to replace it, or choose another --out")

    @contextlib.contextmanager
    def shard(self, index: int) -> Iterator[DirectoryPart]:
        tmp = self.output.scratch(Path(self.output.path))
        try:
            yield DirectoryPart(tmp)
            self._refuse_appeared("while this run built it")
            self.claim.install(tmp)  # held since __init__
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


@dataclass
class InPlaceOutput(WholeOutput):
    """A directory its one part writes in place, as it goes (a checkpoint a trainer saves into, resumed from what
    is there): claimed as ``kind`` when the loop opens, before any work (with the loop's ``overwrite``, grtool's
    entries there are cleared first, a user's kept); ``started(claim)`` then records the run in it. Nothing is moved
    when the part ends: what the part wrote is the output."""

    path: str | Path
    kind: OutputKind
    inputs: Sequence[str | Path | None] = ()
    holders: Sequence[str | Path | None] = ()
    started: Callable[[Claim], object] | None = None

    def open(self, *, overwrite: bool, num_parts: int, shards: tuple[int, int]) -> "InPlaceWriter":
        return InPlaceWriter(self, overwrite)


class InPlaceWriter(WholeWriter):
    """An :class:`InPlaceOutput` opened: claimed, cleared with ``overwrite``, its run recorded."""

    def __init__(self, output: InPlaceOutput, overwrite: bool):
        self.output = output
        claimed = self.hold(claim(output.path, output.kind, inputs=output.inputs, holders=output.holders, overwrite=overwrite))
        if overwrite:
            claimed.clear()
        if output.started is not None:
            output.started(claimed)

    @contextlib.contextmanager
    def shard(self, index: int) -> Iterator[DirectoryPart]:
        yield DirectoryPart(Path(self.output.path))


T = TypeVar("T")


def one_part(outputs: Sequence[WholeOutput], part_fn: Callable[[LoopPart], T], *, overwrite: bool = False) -> T:
    """Run ``part_fn`` as the one part of outputs written whole (files, directories; never a stage directory, whose
    parts :class:`PartLoop` runs): every output claimed before the part starts, each put in place when it returns,
    the claims let go however it ends. Returns what ``part_fn`` returned."""
    loop = PartLoop(outputs, 1, overwrite=overwrite, num_shards=1, shard_index=0)
    returned: list[T] = []
    try:
        loop.run(lambda part: returned.append(part_fn(part)))
    finally:
        loop.finish()
    return returned[0]


@dataclass
class Bar:
    """The loop's progress bar: its name, extra columns over its task's ``fields``, and its total.

    ``total(parts)`` gives the units of the parts to do (the stage advances the bar itself, per row or document);
    without it the bar counts parts, advanced by the loop as each commits. ``progress`` and ``task`` are set while
    the loop runs, for a stage that advances the bar itself.
    """

    description: str
    columns: tuple[Any, ...] = ()
    fields: dict[str, Any] = field(default_factory=dict)
    total: Callable[[list[int]], int | None] | None = None
    progress: Any = None
    task: Any = None


@dataclass
class LoopPart:
    """What a part function gets: the part, and the shards it writes (``shards[k]`` writes output ``k``; None where
    that output already has the part, or has no part of that number)."""

    index: int
    name: str
    shards: list[Any]
    stopping: bool = False

    @property
    def shard(self) -> Any:
        return self.shards[0]

    def stop(self) -> None:
        """No further part starts after this one (which is committed)."""
        self.stopping = True


class PartLoop:
    """This task's parts of a stage: the outputs opened, the parts finished and to do; :meth:`run` drives them.

    Opening it opens the writers (a refused resume or a held lock fails here, before any work)."""

    def __init__(self, outputs: Sequence[Output | WholeOutput], num_parts: int, *, overwrite: bool = False,
                 num_shards: int | None = None, shard_index: int | None = None):  # fmt: skip
        self.outputs = list(outputs)
        self.parts_of = [num_parts if o.num_parts is None else o.num_parts for o in self.outputs]
        self.num_parts = max([num_parts, *self.parts_of])
        self.sharding = resolve_sharding(num_shards, shard_index)
        self.writers = [o.open(overwrite=overwrite, num_parts=n, shards=self.sharding) for o, n in zip(self.outputs, self.parts_of)]
        mine = parts_for_task(self.num_parts, *self.sharding)  # round-robin: the same task owns part i of every output
        finished = {i for i in mine if all(w.done(i) for w, n in zip(self.writers, self.parts_of) if i < n)}
        self.finished = [i for i in mine if i in finished]
        self.todo = [i for i in mine if i not in finished]

    def run(self, part_fn: Callable[[LoopPart], None], bar: Bar | None = None, *, parts: list[int] | None = None,
            before_part: Callable[[int], None] | None = None, after_part: Callable[[int], None] | None = None) -> list[str]:  # fmt: skip
        """Run ``part_fn`` on each part to do (``parts``: fewer, in this order), committing each part's shards when
        it returns (an exception aborts them); ``before_part(i)`` runs before a part's shards open (loading a model,
        outside the part's timing), ``after_part(i)`` once they are committed (a progress bar of the caller's own).
        Returns the names of the parts done."""
        todo = self.todo if parts is None else parts
        done: list[str] = []
        with progress(*bar.columns) if bar is not None else contextlib.nullcontext() as shown:
            if bar is not None:
                total = bar.total(todo) if bar.total is not None else len(todo)
                bar.progress, bar.task = shown, shown.add_task(bar.description, total=total, **bar.fields)
            for i in todo:
                if before_part is not None:
                    before_part(i)
                part = LoopPart(i, part_name(i), [])
                with contextlib.ExitStack() as stack:
                    part.shards = [None if i >= n or w.done(i) else stack.enter_context(w.shard(i)) for w, n in zip(self.writers, self.parts_of)]
                    part_fn(part)
                done.append(part.name)
                if after_part is not None:
                    after_part(i)
                if bar is not None and bar.total is None:
                    shown.advance(bar.task)
                if part.stopping:
                    break
        return done

    def finish(self, *, check_empty: bool = True, **extra: Any) -> list[Manifest | None]:
        """Merge each output's shard records into its manifest (with ``extra`` and the output's ``finish``); None
        for an output on stdout."""
        return [w.finish(check_empty=check_empty, **extra, **o.finish) for w, o in zip(self.writers, self.outputs)]

    def check_empty(self, manifests: list[Manifest | None]) -> None:
        """The empty-result rule (:mod:`grtool.store.empty`) for each output, after a caller's own guard spoke."""
        for w, m in zip(self.writers, manifests):
            w.check_empty(m)
