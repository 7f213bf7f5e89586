"""What the pipeline knows of the commands its stages run: one small interface, filled in by the CLI.

The pipeline (its plan, its executors) never imports the CLI. Whoever runs a pipeline hands it a
:class:`StageCommands`: the ``grtool`` command passes its own (``grtool.cli.stages.COMMANDS``), built from the
functions behind its commands. It is the only thing the local and the Slurm executor share: the local one asks
it to run a stage's command line in this process, the Slurm one writes that command line into a batch script;
both ask it what a stage's command accepts (``--overwrite``, array sharding) and check every stage's options
before the first stage runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


def command_name(run: str) -> str:
    """A stage's ``run`` value with its words normalised ("corpus  ingest" -> "corpus ingest")."""
    return " ".join(run.split())


class StageCommands(ABC):
    """The commands a pipeline stage may run (``run = "corpus ingest"``), as the program that runs them knows them."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every command a stage may run ("corpus ingest", "triples extract", ...)."""

    @abstractmethod
    def accepts(self, run: str, parameter: str) -> bool:
        """Whether the stage's command takes ``parameter`` (``"overwrite"``, ``"num_shards"``); False for a
        command that does not exist."""

    @abstractmethod
    def is_flag(self, run: str, key: str) -> bool:
        """Whether option ``key`` (``--key``) of the command is an on/off flag."""

    @abstractmethod
    def check_arguments(self, run: str, arguments: list[str], where: str) -> None:
        """Parse the arguments after the command words as the command will and make the checks it makes before
        it writes anything; raise :class:`grtool.errors.GrtoolError` naming ``where``."""

    @abstractmethod
    def invoke(self, argv: list[str]) -> int | None:
        """Run ``grtool ARGV`` in this process; returns its exit code (None or 0: success) or raises its error."""

    def input_paths(self, run: str, arguments: list[str]) -> list[tuple[str, str]]:
        """(parameter, path) pairs: the files and directories the command line names for its command to read
        (its path arguments and options, outputs excepted), as the command would parse them; none by default."""
        return []

    def known(self, run: str) -> bool:
        return command_name(run) in self.names()


class NoCommands(StageCommands):
    """No command known: a pipeline file read only for its structure (its schema, placeholders, --set)."""

    def names(self) -> list[str]:
        return []

    def accepts(self, run: str, parameter: str) -> bool:
        return False

    def is_flag(self, run: str, key: str) -> bool:
        return False

    def check_arguments(self, run: str, arguments: list[str], where: str) -> None:
        return None

    def invoke(self, argv: list[str]) -> int | None:
        from grtool.errors import InputError

        raise InputError(f"cannot run grtool {' '.join(argv)}: no commands were given to the pipeline")
