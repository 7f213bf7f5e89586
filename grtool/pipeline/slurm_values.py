"""The shapes Slurm accepts for each key of a ``[slurm]`` table, checked before any batch script is built.

A value goes into an ``#SBATCH`` line or the script's commands, so each key is held to the shape Slurm itself
accepts for it (a partition is a name, ``time`` one of Slurm's time formats, ``gres`` ``name[:type][:count]``,
counts positive and bounded) and no value anywhere may hold a control character (newline, carriage return, tab,
NUL, U+0085, U+2028/2029, invisible format characters): one such character would end an ``#SBATCH`` line early
or start a new shell command. ``setup`` is the one key meant as shell (a line run first in the job); it is held
to one line, and a ``{var}`` placeholder in it (or in ``launch``) is replaced by the value as one quoted word.

Also here: how a value is written on an ``#SBATCH`` line (Slurm's own quoting) and the parsing of Slurm's time
format, shared by the check and the plan's GPU-hours.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from typing import Any

from grtool.errors import InputError

MAX_TEXT = 4096  # a setup line; names are far shorter
MAX_NAME = 128
COUNT_LIMITS = {"nodes": 100_000, "cpus": 100_000, "tasks": 1_000_000, "parallel": 1_000_000}
# What grtool sets itself on every job; an extra argument with one of these would break the pipeline's chaining,
# logs or resume (--wrap would replace the script altogether).
OWN_SBATCH = {"array", "dependency", "wrap", "output", "chdir", "parsable", "test-only", "kill-on-invalid-dep"}
# The same for a stage's srun step: its CPUs come from `cpus`, its output is the job's log (or the stage's
# stdout file), and it runs where the job does.
OWN_SRUN = {"cpus-per-task", "output", "error", "input", "chdir", "pty"}
MAX_SBATCH_ARGS = 32
SHELL_KEYS = ("setup", "launch")  # shell text: a [vars] placeholder in them goes in as one quoted word

_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_NAMES = re.compile(rf"{_NAME}(?:,{_NAME})*", re.ASCII)
_ONE_NAME = re.compile(_NAME, re.ASCII)
_MEM = re.compile(r"[1-9][0-9]{0,11}[KMGTkmgt]?", re.ASCII)
_GRES_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*", re.ASCII)
_GRES_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", re.ASCII)
_COUNT = re.compile(r"[1-9][0-9]{0,5}", re.ASCII)
_TIME = re.compile(r"(?:([0-9]{1,4})-([0-9]{1,2})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?|([0-9]{1,7})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?)", re.ASCII)
_SBATCH_ARG = re.compile(r"--([a-z][a-z0-9\-]*)(=.*)?", re.ASCII | re.DOTALL)
_BAD_CATEGORIES = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}  # controls, invisible format marks, line separators, no character

SHAPES = {
    "partition": "a partition name or a comma-separated list of them (letters, digits, '_', '.', '-')",
    "account": "an account name (letters, digits, '_', '.', '-')",
    "qos": "a QOS name or a comma-separated list of them (letters, digits, '_', '.', '-')",
    "time": "a Slurm time above zero: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)",
    "mem": "a memory amount above zero: digits with an optional K, M, G or T (e.g. 16G, 4000M)",
    "gres": "name[:type][:count], comma-separated (e.g. gpu:1, gpu:a100:2), count at least 1",
    "sbatch": f"a list of at most {MAX_SBATCH_ARGS} sbatch arguments, each --option or --option=value (not {', '.join('--' + o for o in sorted(OWN_SBATCH))}, which grtool sets itself)",
    "srun": f"a list of at most {MAX_SBATCH_ARGS} srun arguments, each --option or --option=value (not {', '.join('--' + o for o in sorted(OWN_SRUN))}, which grtool sets itself)",
    "setup": "one line of shell ({var} placeholders go in quoted)",
    "launch": "words before `grtool` (shell quoting allowed, no shell syntax)",
    **{key: f"an integer, at least 1 and at most {limit}" for key, limit in COUNT_LIMITS.items()},
}


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message shows it: escaped (``'cpu\\ntouch X'``), shortened when long."""
    text = repr(value)
    if len(text) > limit:
        text = f"{text[: limit - 1]}… ({len(value) if isinstance(value, (str, list)) else '?'} characters)"
    return text


def control_character(text: str) -> str | None:
    """The first character of ``text`` that must not reach a script (escaped), or None."""
    for ch in text:
        if unicodedata.category(ch) in _BAD_CATEGORIES:
            return repr(ch)[1:-1]
    return None


def time_minutes(text: str) -> float | None:
    """A Slurm ``--time`` in minutes; ``inf`` for UNLIMITED; None when it is not one of Slurm's formats."""
    text = str(text)
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return float("inf")
    m = _TIME.fullmatch(text)
    if not m:
        return None
    days, dh, dm, ds, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, se = dh, dm or 0, ds or 0
        if h > 23 or mi > 59 or se > 59:
            return None
    elif c is not None:  # HH:MM:SS
        days, h, mi, se = 0, a, b, c
        if mi > 59 or se > 59:
            return None
    else:  # MM or MM:SS
        days, h, mi, se = 0, 0, a, b or 0
        if b is not None and se > 59:
            return None
    return days * 1440 + h * 60 + mi + se / 60


def _gres_ok(text: str) -> bool:
    for item in text.split(","):
        words = item.split(":")
        if len(words) > 3 or not _GRES_NAME.fullmatch(words[0]):
            return False
        rest = words[1:]
        if rest and rest[-1].isascii() and rest[-1].isdigit():
            if not _COUNT.fullmatch(rest[-1]):
                return False
            rest = rest[:-1]
        if any(not _GRES_TYPE.fullmatch(w) or w.isdigit() for w in rest):  # a type; an all-digit one is a misplaced count
            return False
    return True


def _arguments_ok(value: Any, own: set[str]) -> bool:
    """A list of ``--option[=value]`` arguments (sbatch's or srun's), none of those grtool sets (``own``)."""
    if not isinstance(value, list) or len(value) > MAX_SBATCH_ARGS:
        return False
    for arg in value:
        m = _SBATCH_ARG.fullmatch(arg) if isinstance(arg, str) and len(arg) <= MAX_TEXT else None
        if not m or m[1] in own:
            return False
    return True


def _launch_ok(text: str) -> bool:
    try:
        return bool(shlex.split(text))
    except ValueError:
        return False


def _shape_ok(key: str, value: Any) -> bool:
    if key in COUNT_LIMITS:
        return type(value) is int and 1 <= value <= COUNT_LIMITS[key]
    if key in ("sbatch", "srun"):
        return _arguments_ok(value, OWN_SBATCH if key == "sbatch" else OWN_SRUN)
    if not isinstance(value, str) or len(value) > (MAX_TEXT if key in ("setup", "launch") else MAX_NAME):
        return False
    if key in ("partition", "qos"):
        return bool(_NAMES.fullmatch(value))
    if key == "account":
        return bool(_ONE_NAME.fullmatch(value))
    if key == "time":
        minutes = time_minutes(value)
        return minutes is not None and minutes > 0
    if key == "mem":
        return bool(_MEM.fullmatch(value))
    if key == "gres":
        return _gres_ok(value)
    if key == "launch":
        return _launch_ok(value)
    return True  # setup: any one line


def check_slurm_value(key: str, value: Any, where: str) -> None:
    """Raise one line naming ``where`` (``FILE: stage 'x', slurm`` or ``FILE: [slurm]``), the key, the value
    (escaped) and the shape Slurm accepts, when ``value`` is not of that shape."""
    if key not in SHAPES:
        return  # an unknown key is the schema's to report
    texts = value if isinstance(value, list) else [value]
    for text in texts:
        bad = control_character(text) if isinstance(text, str) else None
        if bad:
            raise InputError(f"{where} {key!r}: {shown(value)} holds the control character '{bad}'; expected {SHAPES[key]}")
    if not _shape_ok(key, value):
        raise InputError(f"{where} {key!r}: {shown(value)} is not accepted; expected {SHAPES[key]}")


def check_slurm_settings(settings: dict[str, Any], where: str) -> None:
    """Every value of one ``slurm`` table (see :func:`check_slurm_value`)."""
    for key, value in settings.items():
        if value is not None:
            check_slurm_value(key, value, where)


def sbatch_word(text: str) -> str:
    """``text`` as one word of an ``#SBATCH`` line, the way Slurm reads those lines (whitespace separates words,
    quotes group them, a backslash escapes the next character, an unquoted ``#`` starts a comment)."""
    if re.fullmatch(r"[A-Za-z0-9_./:%@+=,\-]+", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
