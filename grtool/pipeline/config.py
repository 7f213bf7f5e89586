"""Pipeline files: stages in order, each one a grtool command with its arguments and options.

A pipeline file is TOML::

    out = "out/demo"                       # available as {out} in every string below
    note = "printed after the summary"

    [[stages]]
    name = "ingest"                        # unique, used by --from / --until / --set
    run = "corpus ingest"                  # the grtool command
    args = ["examples/data/hotpotqa/x.json"]
    options = { out = "{out}/corpus", dataset = "auto" }
    # outputs = [...]                      # what the stage makes; defaults to options.out (+ reports, stdout)
    # stdout = "{out}/stats.json"          # where to keep the command's stdout (reports with --json)
    # slurm = { tasks = 4, gres = "gpu:1" } # with --executor slurm: this stage's job (over [slurm] defaults)

Options become ``--key value`` (``_`` → ``-``); ``true`` becomes ``--key``, ``false`` ``--no-key``; a list
repeats the option. Each stage runs the very command a user would type, so the plan prints it verbatim.

The file is checked against :class:`PipelineFile` before anything runs: every key's type (``args`` is a list of
strings, never a string split into characters), no unknown keys, and ``{out}`` (or a ``[vars]`` name) as the only
placeholders; ``{{`` and ``}}`` write literal braces. A problem is one line naming the file, the stage and the key.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import msgspec

from grtool.errors import InputError
from grtool.pipeline.registry import NoCommands, StageCommands, command_name
from grtool.pipeline.slurm_values import SHELL_KEYS, check_slurm_settings, check_slurm_value
from grtool.errors import printable
from grtool.userinput import read_input_bytes, shell_word


@dataclass
class Stage:
    name: str
    run: str
    args: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    stdout: str | None = None
    slurm: dict[str, Any] = field(default_factory=dict)  # this stage's [slurm] settings over the file's defaults

    def argv(self, overwrite: bool = False) -> list[str]:
        """The command line after `grtool` (``overwrite``: with ``--overwrite``, as a rerun after changed inputs).
        Arguments after a ``--`` among the args (a file named ``-x``) stay last, after the options."""
        args = [str(a) for a in self.args]
        end = args.index("--") if "--" in args else len(args)
        argv = self.run.split() + args[:end]
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
        return argv + args[end:]

    def command_line(self, overwrite: bool = False, quote: Callable[[str], str] = shell_word) -> str:
        """The stage's command as a shell runs it: a control character as ``$'\x1b'``, never raw (the plan)."""
        line = " ".join(map(quote, ["grtool", *self.argv(overwrite)]))
        return f"{line} > {quote(self.stdout)}" if self.stdout else line

    def identity(self) -> str:
        """The command line that says what the stage makes, as its completion record keeps it: without
        ``--overwrite``, which says only how a run starts (after a run with it, a plain run finds the stage done)."""
        options = {k: v for k, v in self.options.items() if k != "overwrite"}
        # quoted as every earlier grtool quoted it, so the completion records it wrote still match
        return Stage(self.name, self.run, self.args, options, self.outputs, self.stdout).command_line(quote=shlex.quote)

    def to_dict(self) -> dict[str, Any]:
        """The stage as JSON (a Slurm job's record); options as [key, value] pairs, which keep their order (the
        command line, and so the stage's identity, depends on it)."""
        return {"name": self.name, "run": self.run, "args": self.args, "options": [[k, v] for k, v in self.options.items()],
                "outputs": self.outputs, "stdout": self.stdout, "slurm": self.slurm}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Stage":
        return cls(d["name"], d["run"], list(d["args"]), {k: v for k, v in d["options"]}, list(d["outputs"]), d["stdout"], dict(d["slurm"]))


@dataclass
class Pipeline:
    path: Path
    out: str
    stages: list[Stage]
    note: str = ""  # printed after the summary (e.g. what the demo's tiny model cannot do)
    slurm: dict[str, Any] = field(default_factory=dict)  # the [slurm] table: defaults of every stage's job
    set_by: dict[tuple[str, str], str] = field(default_factory=dict)  # (stage, option key) -> the --set that gave it

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


def _coerce(text: str, numbers: bool = True) -> Any:
    """A --set value: TOML scalar syntax when it parses (numbers, true/false, quoted strings), else the text.
    ``numbers=False``: a fraction stays as written (``1e3``, not ``1000.0``): an option or a var takes it as text, as
    the command line gives it, and a command parses its numeric options from that text itself."""
    try:
        value = _toml(f"v = {text}", "--set value")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return text.strip() if not numbers and isinstance(value, float) else value  # (an integer as TOML reads it: 0x10 is 16)


def _toml(text: str, where: str) -> dict[str, Any]:
    """``tomllib.loads``, with arrays or inline tables nested past Python's recursion limit refused as one line
    (tomllib's parser recurses once per level: a 100,000-deep array would otherwise end in a traceback)."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise InputError(f"{where}: not valid TOML (arrays or tables nested too deep)") from None


# ---- the schema of a pipeline file: msgspec checks the types, the messages below name stage and key

Scalar = Union[str, int, float, bool]


class SlurmTable(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A stage's Slurm job (``--executor slurm``): the ``[slurm]`` table's defaults, a stage's ``slurm = {…}`` over them."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None  # --time, e.g. "24:00:00"
    nodes: Optional[int] = None
    cpus: Optional[int] = None  # --cpus-per-task
    mem: Optional[str] = None  # --mem, e.g. "64G"
    gres: Optional[str] = None  # e.g. "gpu:1"
    tasks: Optional[int] = None  # an array of this many tasks, each one shard (--num-shards/--shard-index)
    parallel: Optional[int] = None  # at most this many array tasks at once (--array=0-N%P)
    setup: Optional[str] = None  # a shell line run first, e.g. "source .venv/bin/activate"
    launch: Optional[str] = None  # words before `grtool`, e.g. "accelerate launch --num_processes 8 -m"
    sbatch: list[str] = []  # more sbatch arguments, e.g. ["--exclusive", "--constraint=a100"]
    srun: list[str] = []  # more arguments of the stage's srun step, e.g. ["--gpu-bind=closest"]


class StageTable(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    run: str
    args: list[str] = []
    options: dict[str, Union[Scalar, list[Scalar]]] = {}
    outputs: list[str] = []
    stdout: Optional[str] = None
    slurm: SlurmTable = msgspec.field(default_factory=SlurmTable)


class PipelineFile(msgspec.Struct, forbid_unknown_fields=True):
    stages: list[StageTable]
    out: str = "out"
    note: str = ""
    vars: dict[str, Scalar] = {}  # more placeholders beside {out}
    slurm: SlurmTable = msgspec.field(default_factory=SlurmTable)


_TYPE_WORDS = {"array": "a list", "object": "a table", "str": "a string", "int": "an integer", "float": "a number",
               "bool": "true or false", "date": "a date", "datetime": "a date-time", "time": "a time"}  # fmt: skip
_EXPECTED = {"args": "a list of strings", "outputs": "a list of strings", "options": "a table of option = value",
             "stdout": "a string (a file path)", "name": "a string", "run": "a string (a grtool command)",
             "stages": "a list of [[stages]] tables", "out": "a string", "note": "a string", "vars": "a table of name = value",
             "slurm": "a table of Slurm settings (partition, time, cpus, mem, gres, tasks, ...)"}  # fmt: skip
_SLURM_EXPECTED = {"sbatch": "a list of strings (sbatch arguments)", "srun": "a list of strings (srun arguments)", "nodes": "an integer", "cpus": "an integer", "tasks": "an integer",
                   "parallel": "an integer"}  # fmt: skip
_OPTION_VALUE = "a string, number, true/false or a list of those"


def _shown(item: str, limit: int = 200) -> str:
    """A --set argument quoted for a message, cut to ``limit`` characters (an argument may hold 128 KiB)."""
    if len(item) <= limit:
        return repr(item)
    return f"{item[:limit]!r}… ({len(item):,} characters)"


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _schema_error(path: Path, raw: dict[str, Any], error: msgspec.ValidationError) -> InputError:
    """msgspec's ``Expected `array`, got `str` - at `$.stages[2].args``` as a line naming the stage and the key."""
    text = str(error)
    message, _, at = text.partition(" - at ")
    at = at.strip("`")
    slurm = re.match(r"\$(?:\.stages\[(\d+)\])?\.slurm\.?(\w*)", at)
    if slurm:
        return _slurm_error(path, raw, message, slurm)
    m = re.match(r"\$\.stages\[(\d+)\]\.?(\w*)(.*)$", at)
    where = ""
    key = ""
    if m:
        index, key, rest = int(m[1]), m[2], m[3]
        entry = raw["stages"][index]
        name = entry.get("name") if isinstance(entry, dict) else None
        where = f"stage {name!r}" if isinstance(name, str) else f"stage {index + 1}"
        if key == "options" and rest.startswith("[...]"):
            bad = next((k for k, v in entry["options"].items() if not _valid_option_value(v)), "?")
            return InputError(f"{path}: {where}, option {bad!r}: {_got(message)}, expected {_OPTION_VALUE}")
        if key in ("args", "outputs") and rest:  # an item of the list
            item = int(re.sub(r"\D", "", rest) or 0) + 1
            return InputError(f"{path}: {where}, key {key!r}, item {item}: {_got(message)}, expected a string (quote it)")
    elif at.startswith("$."):
        key = at[2:].split("[")[0].split(".")[0]
        if key == "vars" and "[" in at:
            bad = next((k for k, v in raw["vars"].items() if not isinstance(v, (str, int, float))), "?")
            return InputError(f"{path}: [vars] {bad!r}: {_got(message)}, expected a string or a number")
    unknown = re.match(r"Object contains unknown field `(.+)`", message)
    if unknown:
        fields = list(StageTable.__struct_fields__ if m else PipelineFile.__struct_fields__)
        field_ = unknown[1]
        return InputError(f"{path}: {where or 'top level'}: unknown key {field_!r}{_did_you_mean(field_, fields)}; known keys: {', '.join(fields)}")
    missing = re.match(r"Object missing required field `(.+)`", message)
    if missing:
        return InputError(f"{path}: {where or 'top level'}: missing key {missing[1]!r}")
    if where and not key:  # the stage entry itself
        return InputError(f"{path}: {where}: {_got(message)}, expected a [[stages]] table")
    hint = ""
    if key in ("args", "outputs") and "got `str`" in message:
        hint = f' (write {key} = ["a", "b"], one string per argument)'
    expected = _EXPECTED.get(key, message.split(",")[0].removeprefix("Expected "))
    return InputError(f"{path}: {where + ', ' if where else ''}key {key!r}: {_got(message)}, expected {expected}{hint}")


def _slurm_error(path: Path, raw: dict[str, Any], message: str, m: re.Match) -> InputError:
    """A problem inside ``[slurm]`` or a stage's ``slurm = {…}``, naming the table and the key."""
    where = "[slurm]"
    if m[1] is not None:
        entry = raw["stages"][int(m[1])]
        where = f"stage {entry.get('name')!r}, slurm" if isinstance(entry.get("name"), str) else f"stage {int(m[1]) + 1}, slurm"
    unknown = re.match(r"Object contains unknown field `(.+)`", message)
    if unknown:
        fields = list(SlurmTable.__struct_fields__)
        return InputError(f"{path}: {where}: unknown key {unknown[1]!r}{_did_you_mean(unknown[1], fields)}; known keys: {', '.join(fields)}")
    key = m[2]
    if not key:
        return InputError(f'{path}: {where}: {_got(message)}, expected a table such as {{ tasks = 4, gres = "gpu:1" }}')
    return InputError(f"{path}: {where} key {key!r}: {_got(message)}, expected {_SLURM_EXPECTED.get(key, 'a string')}")


def _got(message: str) -> str:
    m = re.search(r"got `(\w+)`", message)
    return f"got {_TYPE_WORDS.get(m[1], m[1])}" if m else message


def _valid_option_value(value: Any) -> bool:
    try:
        msgspec.convert(value, Union[Scalar, list[Scalar]], strict=True)
    except msgspec.ValidationError:
        return False
    return True


# ---- placeholders: {out} and the [vars] names only; {{ and }} are literal braces

_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def expand(text: str, variables: dict[str, str], where: str, *, shell: bool = False) -> str:
    """``text`` with ``{name}`` replaced; any other ``{…}`` (format specs, attributes, indices) is an error.
    ``shell``: ``text`` is shell (a Slurm ``setup`` line, ``launch`` words): each value goes in as one quoted word."""

    def replace(m: re.Match) -> str:
        token = m[0]
        if token in ("{{", "}}"):
            return token[0]
        if token in ("{", "}"):
            raise InputError(f"{where}: a lone {token!r} in {text!r}; write {{{{ and }}}} for literal braces, {{out}} for the out directory")
        if m[1] not in variables:
            known = ", ".join("{" + v + "}" for v in variables)
            raise InputError(f"{where}: unknown placeholder {token} in {text!r}{_did_you_mean(m[1], list(variables))}; "
                             f"placeholders: {known} (write {{{{ and }}}} for literal braces)")  # fmt: skip
        return shlex.quote(variables[m[1]]) if shell else variables[m[1]]

    expanded = _FIELD.sub(replace, text)
    empty = [name for name, value in variables.items() if not value.strip() and "{" + name + "}" in text]
    if empty and not shell and _rooted(expanded) and not _rooted(expand(text, {**variables, **dict.fromkeys(empty, "x")}, where)):
        names = ", ".join("{" + name + "}" for name in empty)
        raise InputError(f"{where}: {names} {'is' if len(empty) == 1 else 'are'} empty, so {text!r} would become a path at the root of the file system; give it a value")
    return expanded


def _rooted(text: str) -> bool:
    """An absolute path, or an option spelled with one (``--out=/run``); blanks before it count as nothing."""
    return text.lstrip().startswith("/") or "=/" in text.replace(" ", "")


def _expand(value: Any, variables: dict[str, str], where: str, *, shell: bool = False) -> Any:
    if isinstance(value, str):
        return expand(value, variables, where, shell=shell)
    if isinstance(value, list):
        return [_expand(v, variables, where) for v in value]
    return value


def _expand_slurm(key: str, value: Any, variables: dict[str, str], where: str) -> Any:
    """A Slurm value with its placeholders replaced; in the shell keys (``setup``, ``launch``) a value stays
    data: one quoted word, never shell syntax."""
    return _expand(value, variables, where, shell=key in SHELL_KEYS)


def _var_text(value: Any, where: str) -> str:
    """A [vars] value as the text that replaces its placeholder: a string or a number, never true or false (which
    would be the text ``True``). An empty one may end a name (``run{suffix}``), never begin a path (:func:`expand`)."""
    if isinstance(value, bool):
        raise InputError(f"{where}: {str(value).lower()}, but a var is text that replaces its placeholder: a string or a number")
    if isinstance(value, float) and not math.isfinite(value):  # TOML's words for no number
        raise InputError(f"{where}: {value}, but a var is text that replaces its placeholder: a string or a finite number")
    return str(value)


def option_key(key: str) -> str:
    """An option's key as a stage holds it, however the file or ``--set`` spells it (``dev-share``: ``dev_share``):
    what reads a stage's options (its outputs, its checks) finds it under one name."""
    return key.replace("-", "_")


def _expand_stage(entry: dict[str, Any], variables: dict[str, str], where: str) -> dict[str, Any]:
    expanded = {}
    for key, value in entry.items():
        if key == "options":
            expanded[key] = {}
            for k, v in value.items():
                name = option_key(k)
                if name in expanded[key]:
                    raise InputError(f"{where}: option {k!r} is given twice (as {next(o for o in value if option_key(o) == name)!r} too); give it once")
                expanded[key][name] = _expand(v, variables, f"{where}, option {k!r}")
        elif key == "slurm":
            expanded[key] = {k: _expand_slurm(k, v, variables, f"{where}, slurm {k!r}") for k, v in value.items()}
        else:
            expanded[key] = _expand(value, variables, f"{where}, key {key!r}")
    return expanded


def load_pipeline(path: str | Path, overrides: list[str] | None = None, commands: StageCommands | None = None) -> Pipeline:
    """Read and check a pipeline file; ``overrides`` are ``stage.key=value`` (``key`` is an option, or args/outputs/stdout,
    or ``slurm.KEY`` for the stage's Slurm job), ``slurm.KEY=value`` (the ``[slurm]`` defaults) and ``vars.NAME=value``
    (a ``[vars]`` value, before it replaces its placeholders everywhere, ``[slurm]`` tables included). ``commands``
    (the commands stages may run) check that on/off options are true or false; without them only the file's own
    structure is checked."""
    commands = commands or NoCommands()
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise InputError(f"{printable(path)}: no such pipeline file")
    try:  # a FIFO or a device is named, never waited on
        raw = _toml(read_input_bytes(path).decode("utf-8"), printable(path))
    except UnicodeDecodeError as e:
        raise InputError(f"{printable(path)}: not valid TOML (not UTF-8 text: {e.reason} at byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: not valid TOML ({e})") from None
    try:
        spec = msgspec.convert(raw, PipelineFile, strict=True)
    except msgspec.ValidationError as e:
        raise _schema_error(path, raw, e) from None
    if not spec.stages:
        raise InputError(f"{path}: needs at least one [[stages]] table")
    if not spec.out.strip():  # "{out}/corpus" would become "/corpus": the root of the file system
        raise InputError(f'{path}: out is empty; name the directory the stages write under (out = "out/run")')
    if "out" in spec.vars:  # {out} would be the var everywhere, while the plan and the run summary name the top-level out
        raise InputError(f"{path}: [vars] 'out' ({printable(spec.vars['out'])!r}) would replace the top-level out ({printable(spec.out)!r}); "
                         f"set the run directory once, as out = \"...\" at the top of the file")  # fmt: skip
    variables = {"out": spec.out, **{k: _var_text(v, f"{path}: [vars] {k!r}") for k, v in spec.vars.items()}}
    overrides = list(overrides or [])
    var_sets = [o for o in overrides if o.startswith("vars.") and all(stage.name != "vars" for stage in spec.stages)]
    var_set_by: dict[str, str] = {}
    for item in var_sets:  # before any placeholder is expanded: they move every use
        name, sep, value = item[5:].partition("=")
        if not sep or not name:
            raise InputError(f"--set {_shown(item)}: expected vars.NAME=value")
        if name not in spec.vars:
            known = ", ".join(spec.vars) or "none"
            raise InputError(f"--set {_shown(item)}: {path} has no var {name!r}{_did_you_mean(name, list(spec.vars))} ([vars]: {known})")
        variables[name] = _var_text(_coerce(value, numbers=False), f"--set {_shown(item)}")
        var_set_by[name] = f"--set {_shown(item)}"
    for name, value in variables.items():  # a var's value goes in as written: {out} in it would stay "{out}" in every path
        inner = next((m[0] for m in _FIELD.finditer(value) if m[1] in variables), None) if name != "out" else None
        if inner is not None:
            raise InputError(f"{var_set_by.get(name, f'{path}: [vars] {name!r}')} ({printable(value)!r}) holds the placeholder {inner}, which a var's value does not expand; "
                             f"write it where the var is used (\"{inner}/...\" in the stage), or give the var a whole value")  # fmt: skip
    # The [vars] may place the run directory too (out = "{base}/run"); a placeholder it does not know is an error.
    variables["out"] = _expand(spec.out, {k: v for k, v in variables.items() if k != "out"}, f"{path}: out")
    if not variables["out"].strip():
        raise InputError(f"{path}: out {printable(spec.out)!r} is empty once its placeholders are replaced; name the directory the stages write under")
    by_name: dict[str, dict[str, Any]] = {}
    for stage in spec.stages:
        if stage.name in by_name:
            raise InputError(f"{path}: stage name {stage.name!r} is used twice")
        by_name[stage.name] = {**msgspec.structs.asdict(stage), "slurm": msgspec.to_builtins(stage.slurm)}
    defaults = {k: _expand_slurm(k, v, variables, f"{path}: [slurm] {k!r}") for k, v in msgspec.to_builtins(spec.slurm).items()}
    # Placeholders are expanded (and checked) in the file's values first, then in each --set value.
    by_name = {name: _expand_stage(entry, variables, f"{path}: stage {name!r}") for name, entry in by_name.items()}
    # The Slurm values as they will reach a batch script: after their placeholders, each of Slurm's shape.
    check_slurm_settings(defaults, f"{path}: [slurm]")
    for name, entry in by_name.items():
        check_slurm_settings(entry["slurm"], f"{path}: stage {name!r}, slurm")
    set_by: dict[tuple[str, str], str] = {}
    for item in overrides:
        if item in var_sets:
            continue  # applied above
        target, sep, value = item.partition("=")
        stage_name, dot, key = target.partition(".")
        if not sep or not dot or not key:
            raise InputError(f"--set {_shown(item)}: expected stage.key=value")
        if stage_name == "slurm" and stage_name not in by_name:  # the [slurm] defaults
            defaults[key] = _slurm_value(key, value, variables, f"--set {_shown(item)}")
            continue
        if stage_name not in by_name:
            raise InputError(f"--set {_shown(item)}: no stage named {stage_name!r}{_did_you_mean(stage_name, list(by_name))} (stages: {', '.join(by_name)})")
        entry = by_name[stage_name]
        where = f"--set {_shown(item)}"
        if key in ("args", "outputs"):
            try:
                words = shlex.split(value)
            except ValueError as e:  # an unclosed quote
                raise InputError(f"{where}: cannot split the value into words ({e})") from None
            entry[key] = _expand(words, variables, where)
        elif key == "stdout":
            entry[key] = _expand(value, variables, where)
        elif key.startswith("slurm."):
            entry["slurm"] = {**entry["slurm"], key[6:]: _slurm_value(key[6:], value, variables, where)}
        else:
            _check_option_name(commands, entry, key, where)
            entry["options"] = {**entry["options"], option_key(key): _expand(_coerce(value, numbers=False), variables, where)}
            set_by[(stage_name, option_key(key))] = where  # a value it refuses is blamed on the --set, not the file
            entry["args"] = commands.args_without(entry["run"], entry["args"], key)  # it overrides one written among them

    stages = []
    for entry in by_name.values():
        where = f"{path}: stage {entry['name']!r}"
        if entry["stdout"] is not None and not entry["stdout"].strip():
            raise InputError(f"{where}: stdout is empty; name the file to keep the command's output in, or leave stdout out")
        for key, value in entry["options"].items():
            _check_option_value(commands, entry, key, value, set_by.get((entry["name"], key), f"{where}, option {key!r}"))
        declared = commands.declared(entry["run"])
        values = commands.values(entry["run"], entry["args"], entry["options"])  # `--out X` among the args too
        beside = [path for _, path in declared.files_beside(values)] if declared is not None else []  # export sft's dev file
        out = values.get("out")
        outputs = entry["outputs"] or ([out, *beside] if isinstance(out, str) else [])
        # Its reports, plots and TREC files, and its stdout, are its outputs too: one edited or removed since is
        # found (the stage is not done), as its --out is.
        files = [*(declared.single_files(values) if declared is not None else []), *([entry["stdout"]] if entry["stdout"] else [])]
        outputs = [*outputs, *(f for f in files if f not in outputs)]
        stages.append(Stage(entry["name"], entry["run"], entry["args"], entry["options"], outputs, entry["stdout"], entry["slurm"]))
    return Pipeline(path, variables["out"], stages, spec.note, defaults, set_by)


def _check_option_name(commands: StageCommands, entry: dict[str, Any], key: str, where: str) -> None:
    """A ``--set stage.KEY`` names an option of the stage's command (checked when grtool knows the command)."""
    options = commands.options(entry["run"])
    if options and key.replace("-", "_") not in options:
        keys = list(options)
        close = difflib.get_close_matches(key.replace("-", "_"), keys, n=3)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise InputError(f"{where}: stage {entry['name']!r} ({command_name(entry['run'])}) has no option {key!r}{hint}; "
                         f"its options: {', '.join(keys)} (and the stage keys args, outputs, stdout, slurm.KEY)")  # fmt: skip


def _check_option_value(commands: StageCommands, entry: dict[str, Any], key: str, value: Any, where: str) -> None:
    """A flag takes true or false; an option that takes a value takes neither (``--split`` with no text after it
    would take the next option as its value), nor empty text (an empty path is the working directory)."""
    flag = commands.options(entry["run"]).get(key.replace("-", "_"))
    if flag is None:
        return  # not an option of the command: its parser names it
    if flag:
        if not isinstance(value, bool):
            raise InputError(f"{where}: {value!r} is not true or false (a flag)")
        return
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool):
            raise InputError(f"{where}: {str(item).lower()} is not a value of --{key.replace('_', '-')}, which takes a value, not true or false")
        if isinstance(item, str) and not item.strip():
            raise InputError(f"{where}: {item!r} is empty; give --{key.replace('_', '-')} a value, or leave the option out")


def _slurm_value(key: str, text: str, variables: dict[str, str], where: str) -> Any:
    """A ``--set …slurm.KEY=value``: a known key of :class:`SlurmTable`, of its type."""
    fields = list(SlurmTable.__struct_fields__)
    if key not in fields:
        raise InputError(f"{where}: unknown Slurm key {key!r}{_did_you_mean(key, fields)}; known keys: {', '.join(fields)}")
    try:
        value = _expand_slurm(key, shlex.split(text) if key in ("sbatch", "srun") else _coerce(text), variables, where)
    except ValueError as e:  # an unclosed quote in the sbatch or srun arguments
        raise InputError(f"{where}: cannot split the value into words ({e})") from None
    if key not in ("sbatch", "srun", "nodes", "cpus", "tasks", "parallel"):
        value = str(value)  # time = 1:00:00 or mem = 64 stay text
    try:
        msgspec.convert({key: value}, SlurmTable, strict=True)
    except msgspec.ValidationError as e:
        raise InputError(f"{where}: {_got(str(e))}, expected {_SLURM_EXPECTED.get(key, 'a string')}") from None
    check_slurm_value(key, value, f"{where}: slurm")
    return value
