"""What users type, parsed once and bounded (DESIGN §8): numbers given as options and every environment variable
grtool reads. A wrong value is one :class:`InputError` line (exit 2) naming the option or variable, the value and
what is accepted — never a traceback, never a silent default, never ``inf`` or ``nan`` flowing into a stage.

* :func:`parse_number` is the one number parser: finite, in range, an integer where one is asked for.
* :data:`VARIABLES` declares every environment variable grtool reads, once, with its parser; :func:`env` reads one
  through it and :func:`check_environment` parses them all when a command starts, before anything is written.
  ``docs/reference/environment.md`` lists the same variables (a test checks both ways).

The bottom floor: it imports only :mod:`grtool.errors`.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from grtool.errors import InputError, printable

# No count or size a user gives comes near 2**53; past it floats stop counting, JSON readers lose digits, and a
# typo such as 10**30 rows would fail deep inside a library instead of here.
MAX_INTEGER = 2**53
MAX_REAL = 1e15


def escaped(text: str) -> str:
    """``text`` on one printable line: control characters and newlines as escapes, a byte that is not UTF-8 (a
    surrogate escape in Python) as the ``\\xNN`` it was."""
    if text.isprintable():
        return text
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return re.sub(r"\\udc([89a-f][0-9a-f])", r"\\x\1", out)


def controls_escaped(text: str) -> str:
    """``text`` with its control characters (a newline, ESC, BEL) as escapes and everything else as it is: for lines
    meant to be read and copied (a plan's comments), where :func:`escaped` would also escape a no-break space."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) == "Cc" else c for c in text)


def shell_word(word: str) -> str:
    """``word`` quoted for a shell, as :func:`shlex.quote` does; one holding a control character other than a
    newline is written with bash's ``$'...'``, which keeps it exact and off the terminal (ESC, BEL)."""
    import shlex

    if not any(unicodedata.category(c) == "Cc" and c != "\n" for c in word):
        return shlex.quote(word)
    inner = "".join("\\\\" if c == "\\" else "\\'" if c == "'" else (f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}")
                    if unicodedata.category(c) == "Cc" else c for c in word)  # fmt: skip
    return f"$'{inner}'"


def shown(value: object) -> str:
    """A value as messages quote it: quoted, :func:`escaped`, and cut to a readable length; a list as a list of
    them (``['a', 'b']``, not the quoted text of a list), a table as one."""
    if isinstance(value, (list, tuple, dict)):
        items = (f"{shown(k)}: {shown(v)}" for k, v in value.items()) if isinstance(value, dict) else map(shown, value)
        text = ("{%s}" if isinstance(value, dict) else "[%s]") % ", ".join(items)
    else:
        text = "'" + escaped(value if isinstance(value, str) else str(value)).replace("'", "\\'") + "'"
    return text if len(text) <= 80 else text[:60] + "…" + text[-12:]


def describe(*, integer: bool, low: float | None, high: float | None) -> str:
    """What a number parser accepts, in words: 'an integer from 1 to 9,007,199,254,740,992'."""
    kind = "an integer" if integer else "a number"

    def fmt(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() and abs(x) <= MAX_INTEGER else f"{x:g}"

    if low is not None and high is not None:
        return f"{kind} from {fmt(low)} to {fmt(high)}"
    if low is not None:
        return f"{kind} of at least {fmt(low)}"
    if high is not None:
        return f"{kind} of at most {fmt(high)}"
    return kind


def parse_number(text: str | int | float, *, integer: bool, low: float | None = None, high: float | None = None) -> Any:
    """``text`` as an int (``integer``) or a finite float within [low, high]; ``ValueError`` says what is accepted.
    Integers are bounded by ±:data:`MAX_INTEGER` and reals by ±:data:`MAX_REAL` even where no bound is given."""
    high = min(high, MAX_INTEGER if integer else MAX_REAL) if high is not None else (MAX_INTEGER if integer else MAX_REAL)
    low = max(low, -MAX_INTEGER if integer else -MAX_REAL) if low is not None else (-MAX_INTEGER if integer else -MAX_REAL)
    accepted = describe(integer=integer, low=low, high=high)
    value: Any
    if isinstance(text, bool):
        raise ValueError(f"expected {accepted}")
    if isinstance(text, (int, float)):
        value = text
    else:
        word = text.replace("_", "")
        # Python's int() and float() take surrounding blanks and any script's digits ("١"): a number typed or set
        # in the environment is ASCII without blanks. int() of a 4,300-digit string raises: no sane number is long.
        if len(word) > 40 or not word.isascii() or word != word.strip():
            raise ValueError(f"expected {accepted}")
        try:
            value = int(word) if integer else float(word)
        except ValueError:
            try:  # an integer may be written 1e6
                value = float(word) if integer else None
            except ValueError:
                value = None
            if value is None:
                raise ValueError(f"expected {accepted}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"expected {accepted} (infinity and NaN are not numbers here)")
    if integer and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"expected {accepted}")
        value = int(value)
    if not low <= value <= high:
        raise ValueError(f"expected {accepted}")
    return value


# ---- environment variables


@dataclass(frozen=True)
class Variable:
    """One environment variable grtool reads. ``parse`` turns its text into the value (ValueError saying what is
    accepted); an unset or empty variable is ``default``. ``secret``: messages never show the value."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    meaning: str
    secret: bool = False


def _number(*, integer: bool, low: float | None = None, high: float | None = None) -> Callable[[str], Any]:
    return lambda text: parse_number(text, integer=integer, low=low, high=high)


def _directory(text: str) -> Path:
    """A directory grtool may create. One it cannot write (a read-only file system, a file in its place) is not
    refused here: a cache that cannot be written is read as it is, and writes to it are named where they fail."""
    return Path(text).expanduser()


def _hold(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition(":")
    if not sep or not name or not folder:
        raise ValueError("expected POINT:DIRECTORY")
    return name, Path(folder)


def _text(text: str) -> str:
    return text


MAX_ARRAY_TASKS = 4_000_001  # Slurm's own upper limit of MaxArraySize; ids run below twice that

VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in (
        Variable("GRTOOL_CACHE", _directory, None, "where converted models, tokenizers and bracket-decoding lookups are kept"),
        Variable("XDG_CACHE_HOME", _directory, None, "the cache's parent when GRTOOL_CACHE is unset"),
        Variable("GRTOOL_LOOKUP_CACHE_GB", _number(integer=False, low=0, high=2**20), 20.0, "upper bound of the lookup files in the cache, in GB"),
        Variable("GRTOOL_PROGRESS_INTERVAL", _number(integer=False, low=0, high=86_400), 10.0, "seconds between progress lines in a log"),
        Variable("GRTOOL_HOLD", _hold, None, "tests only: hold a command at a named point"),
        Variable("SLURM_ARRAY_TASK_COUNT", _number(integer=True, low=1, high=MAX_ARRAY_TASKS), None, "tasks of a Slurm array"),
        Variable("SLURM_ARRAY_TASK_ID", _number(integer=True, low=0, high=2 * MAX_ARRAY_TASKS), None, "this task's id in a Slurm array"),
        Variable("SLURM_ARRAY_TASK_MIN", _number(integer=True, low=0, high=2 * MAX_ARRAY_TASKS), 0, "the first id of a Slurm array"),
        Variable("SLURM_ARRAY_TASK_STEP", _number(integer=True, low=1, high=2 * MAX_ARRAY_TASKS), 1, "the step between the ids of a Slurm array"),
        Variable("WORLD_SIZE", _number(integer=True, low=1, high=2**20), 1, "processes of a training run (torchrun, accelerate)"),
        Variable("RANK", _number(integer=True, low=0, high=2**20), 0, "this process's rank in a training run"),
        Variable("COLUMNS", _number(integer=True, low=1, high=100_000), None, "width of tables and log lines"),
        Variable("OPENAI_API_KEY", _text, None, "the API key of --backend openai", secret=True),
        Variable("KUBEFLOW_TRAINER_SERVER_URL", _text, None, "the Kubeflow trainer server of train --report-to kubeflow (set by a TrainJob)"),
        Variable("DISABLE_KUBEFLOW_INTEGRATION", _text, None, "TRUE turns transformers' Kubeflow reporting off"),
    )
}


def env(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of the registered variable ``name`` (its default when unset or empty) in ``environ`` (this
    process's environment by default); a wrong value is an :class:`InputError` naming the variable, its value and
    what is accepted."""
    variable = VARIABLES[name]
    text = (os.environ if environ is None else environ).get(name)
    if not text:
        return variable.default
    try:
        return variable.parse(text)
    except ValueError as e:
        value = "(value not shown)" if variable.secret else shown(text)
        raise InputError(f"environment variable {name}={value}: {e}") from None


def check_environment() -> None:
    """Parse every registered variable that is set: a command with a wrong one stops before it writes anything."""
    for name in VARIABLES:
        env(name)


def cache_root() -> Path:
    """grtool's cache: ``$GRTOOL_CACHE``, else ``$XDG_CACHE_HOME/grtool``, else ``~/.cache/grtool``."""
    own = env("GRTOOL_CACHE")
    if own is not None:
        return own
    return (env("XDG_CACHE_HOME") or Path.home() / ".cache") / "grtool"


# ---- the width of what is drawn

LOG_WIDTH = 160  # columns of --help and of the logs that no terminal limits: wide enough for option names and their help


def log_width(stream: IO | None, fallback: int = LOG_WIDTH) -> int | None:
    """Columns for Rich output to ``stream``: an exported ``COLUMNS``, else None on a terminal (Rich measures
    it), else ``fallback``, never Rich's 80-column fallback."""
    try:
        columns = env("COLUMNS")
    except InputError:  # read at import, before a command can report it: the command's start refuses it
        columns = None
    if columns is not None:
        return columns
    try:
        if stream is not None and stream.isatty():
            return None
    except (AttributeError, ValueError):  # a closed or unusual stream
        pass
    return fallback


# ---- nesting of the JSON users give

# No dataset record nests deeper than a handful of levels; past this one a record is damaged or not a dataset's,
# and deeper ones would overflow the recursion of the JSON writers (orjson stops at 254 levels) and readers.
MAX_NESTING = 100


class TooDeep(ValueError):
    """A JSON value nested deeper than :data:`MAX_NESTING`."""

    def __init__(self) -> None:
        super().__init__(f"nested deeper than {MAX_NESTING} levels (no dataset record is; damaged, or not a dataset file)")


def check_nesting(value: Any, limit: int = MAX_NESTING) -> None:
    """Raise :class:`TooDeep` when the lists and dicts of ``value`` nest deeper than ``limit`` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth > limit:
            raise TooDeep()
        stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))


def may_nest_deeply(data: bytes | str, limit: int = MAX_NESTING) -> bool:
    """Quick test of JSON text: False when it holds too few brackets to nest past ``limit``."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") > limit
    return data.count(b"[") + data.count(b"{") > limit


def nesting_events(events: Any, on_too_deep: Callable[[], Exception], limit: int = MAX_NESTING) -> Any:
    """Pass ijson parse events through, raising ``on_too_deep()`` once they nest past ``limit`` + 1 (the array
    around the records): a record nested 100,000 levels deep is refused at level ``limit``, before ijson spends
    quadratic time building it."""
    depth = 0
    for event in events:
        kind = event[1]
        if kind == "start_map" or kind == "start_array":
            depth += 1
            if depth > limit + 1:
                raise on_too_deep()
        elif kind == "end_map" or kind == "end_array":
            depth -= 1
        yield event


# ---- paths users name as inputs


def refuse_folder_spelling(value: Any, label: str) -> Any:
    """``value`` as given, unless it is text ending in ``/`` where ``label`` writes one file: that names a folder,
    and ``Path`` would drop the slash and a file by the folder's name be written."""
    if isinstance(value, str) and value.endswith("/"):
        raise InputError(f"{label} {printable(value)}: ends in '/', so it names a directory, and the option writes one file: name the file")
    return value


def missing_input(path: str | Path) -> InputError:
    """Why ``path`` is neither a readable file nor a directory, as one line: a FIFO, a device or a socket named as
    what it is (grtool reads its inputs more than once, so it needs a file), a closed ``/dev/fd/N``, a dangling
    symbolic link, a directory it may not enter, else "no such file or directory"."""
    import re

    from grtool.records import file_kind

    p, shown_path = Path(path), printable(path)
    kind = file_kind(p)
    if kind is not None:
        return InputError(f"{shown_path}: {kind}, not a regular file: grtool reads its inputs from files (some more than once); write it to a file first")
    fd = re.fullmatch(r"/(?:dev|proc/self)/fd/(\d+)", str(p))
    if fd and not os.path.exists(p):
        return InputError(f"{shown_path}: file descriptor {fd.group(1)} is not open in this process")
    try:
        os.stat(p)
    except PermissionError:
        return InputError(f"{shown_path}: permission denied (a directory on the way may not be entered)")
    except OSError as e:
        if os.path.islink(p):
            return InputError(f"{shown_path}: a symbolic link to {printable(os.readlink(p))}, which does not exist")
        if e.errno is not None and e.strerror and not isinstance(e, FileNotFoundError):
            return InputError(f"{shown_path}: {e.strerror.lower()}")
    return InputError(f"{shown_path}: no such file or directory")


def require_input(path: str | Path) -> Path:
    """``path`` as a Path when it is a regular file or a directory; else :func:`missing_input`'s one line."""
    p = Path(path)
    if not (p.is_file() or p.is_dir()):
        raise missing_input(p)
    return p


def read_input_bytes(path: str | Path) -> bytes:
    """The bytes of a small file the user names (a pipeline file, a config, a report): opened without blocking,
    so a FIFO or a device is named (:func:`missing_input`) instead of waited on."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise missing_input(path) from None
    except OSError as e:
        raise InputError(f"{printable(path)}: cannot read it ({(e.strerror or str(e)).lower()})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise missing_input(path) if not os.path.isdir(path) else InputError(f"{printable(path)}: a directory, not a file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise InputError(f"{printable(path)}: cannot read it ({(e.strerror or str(e)).lower()})") from None
    finally:
        os.close(fd)
