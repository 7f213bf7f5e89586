"""Pipeline files: stages in order, each one a grtool command with its arguments and options.

A pipeline file is TOML::

    out = "out/demo"                       # available as {out} in every string below
    note = "printed after the summary"

    [[stages]]
    name = "ingest"                        # unique, used by --from / --until / --set
    run = "corpus ingest"                  # the grtool command
    args = ["examples/data/hotpotqa/x.json"]
    options = { out = "{out}/corpus", dataset = "auto" }
    # outputs = [...]                      # what the stage makes; defaults to options.out
    # stdout = "{out}/stats.json"          # where to keep the command's stdout (reports with --json)

Options become ``--key value`` (``_`` → ``-``); ``true`` becomes ``--key``, ``false`` ``--no-key``; a list
repeats the option. Each stage runs the very command a user would type, so the plan prints it verbatim.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grtool.errors import InputError


@dataclass
class Stage:
    name: str
    run: str
    args: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    stdout: str | None = None

    def argv(self, overwrite: bool = False) -> list[str]:
        """The command line after `grtool` (``overwrite``: with ``--overwrite``, as a rerun after changed inputs)."""
        argv = self.run.split() + [str(a) for a in self.args]
        for key, value in self.options.items():
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + key.replace("_", "-"))
            elif isinstance(value, list):
                for item in value:
                    argv += [flag, str(item)]
            elif value is not None:
                argv += [flag, str(value)]
        if overwrite and "--overwrite" not in argv:
            argv.append("--overwrite")
        return argv

    def command_line(self, overwrite: bool = False) -> str:
        line = shlex.join(["grtool", *self.argv(overwrite)])
        return f"{line} > {shlex.quote(self.stdout)}" if self.stdout else line


@dataclass
class Pipeline:
    path: Path
    out: str
    stages: list[Stage]
    note: str = ""  # printed after the summary (e.g. what the demo's tiny model cannot do)

    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    def select(self, start: str | None, until: str | None) -> list[Stage]:
        names = self.names()
        for n in (start, until):
            if n is not None and n not in names:
                raise InputError(f"{self.path}: no stage named {n!r} (stages: {', '.join(names)})")
        lo = names.index(start) if start else 0
        hi = names.index(until) + 1 if until else len(names)
        return self.stages[lo:hi]


def _coerce(text: str) -> Any:
    """A --set value: TOML scalar syntax when it parses (numbers, true/false, quoted strings), else the text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _expand(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, str):
        try:
            return value.format(**variables)
        except (KeyError, IndexError, ValueError) as e:
            raise InputError(f"cannot expand {value!r}: unknown placeholder {e}") from None
    if isinstance(value, list):
        return [_expand(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, variables) for k, v in value.items()}
    return value


def load_pipeline(path: str | Path, overrides: list[str] | None = None) -> Pipeline:
    """Read a pipeline file; ``overrides`` are ``stage.key=value`` (``key`` is an option, or args/outputs/stdout)."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such pipeline file") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML ({e})") from None
    variables = {"out": raw.get("out", "out"), **{k: str(v) for k, v in raw.get("vars", {}).items()}}
    entries = raw.get("stages")
    if not isinstance(entries, list) or not entries:
        raise InputError(f"{path}: needs at least one [[stages]] table")
    by_name: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(entries):
        for required in ("name", "run"):
            if not isinstance(entry.get(required), str):
                raise InputError(f"{path}: stage {i + 1} has no {required!r} string")
        unknown = set(entry) - {"name", "run", "args", "options", "outputs", "stdout"}
        if unknown:
            raise InputError(f"{path}: stage {entry['name']!r} has unknown keys {sorted(unknown)}")
        if entry["name"] in by_name:
            raise InputError(f"{path}: stage name {entry['name']!r} is used twice")
        by_name[entry["name"]] = {"args": [], "options": {}, **entry}

    for item in overrides or []:
        target, sep, value = item.partition("=")
        stage_name, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise InputError(f"--set {item!r}: expected stage.key=value")
        if stage_name not in by_name:
            raise InputError(f"--set {item!r}: no stage named {stage_name!r} (stages: {', '.join(by_name)})")
        entry = by_name[stage_name]
        if key in ("args", "outputs"):
            entry[key] = shlex.split(value)
        elif key == "stdout":
            entry[key] = value
        else:
            entry["options"] = {**entry["options"], key: _coerce(value)}

    stages = []
    for entry in by_name.values():
        entry = _expand(entry, variables)
        outputs = entry.get("outputs") or ([entry["options"]["out"]] if "out" in entry["options"] else [])
        if entry.get("stdout"):
            outputs = [*outputs, entry["stdout"]]
        stages.append(Stage(entry["name"], entry["run"], entry["args"], entry["options"], outputs, entry.get("stdout")))
    return Pipeline(path, variables["out"], stages, str(raw.get("note", "")))
