"""The fuzzer's run and its tools (tests/project/test_fuzz_records.py): one small real run, the commands that read it, the
answers they give on it intact, and the ways a file of it is damaged.

The run is built once per session at a fixed path (records hold absolute input paths, so a copy elsewhere would
point back at the original); every example copies the pristine run to that path, damages the copy, runs one
command on it in a subprocess and removes it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from run_helpers import write_small_run

# DESIGN §8: 0 done, 1 data problem, 2 usage/input error, 75 transient (interrupted, retry).
EXIT_CODES = {0, 1, 2, 75}
# A command on this run finishes in seconds even on a loaded machine; past this it hangs (a FIFO read, a lock wait).
HANG_SECONDS = 60

PIPELINE = """\
out = "run"

[[stages]]
name = "index"
run = "index build"
args = ["{out}/triples"]
options = { tokenizer = "default", kind = "fm", out = "{out}/index" }

[[stages]]
name = "export-sft"
run = "export sft"
args = ["{out}/chains"]
options = { corpus = "{out}", out = "{out}/export/sft.json" }

[[stages]]
name = "recall"
run = "eval recall"
args = ["responses.jsonl"]
options = { corpus = "{out}", triples = "{out}/triples", json = true }
stdout = "{out}/reports/recall.json"

[[stages]]
name = "stats"
run = "corpus stats"
args = ["{out}"]
options = { json = true }
stdout = "{out}/reports/stats.json"
"""


def build_run(root: Path) -> str:
    """A real run under ``root``: :func:`write_small_run` (ingest, triples, chains, responses), then `pipeline run`
    of index build, export sft, eval recall and corpus stats (so `_pipeline/` records exist). Returns a whole docid
    of the index (for `index query`)."""
    triples = write_small_run(root / "run", root / "responses.jsonl")
    (root / "p.toml").write_text(PIPELINE)
    grtool(root, "pipeline", "run", "p.toml", check=True)
    return triples[0]["docid"].removeprefix("<docid_start>").removesuffix("<docid_end>")


# ---------------------------------------------------------------------------------------------- running commands


@dataclass
class Result:
    argv: list[str]
    returncode: int | None  # None: still running at HANG_SECONDS (killed)
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"grtool {' '.join(self.argv)} -> exit {self.returncode}\nstdout:\n{self.stdout[-2000:]}\nstderr:\n{self.stderr[-3000:]}"


# A reader that takes /dev/zero for a file would fill the machine's memory (the kernel then kills something, maybe
# not the command): each command gets this much, and such a reader fails with a MemoryError traceback instead.
MEMORY_LIMIT = 3 * 2**30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))


def grtool(cwd: Path, *argv: str, env: dict[str, str] | None = None, check: bool = False, timeout: float = HANG_SECONDS) -> Result:
    """``python -m grtool ARGV`` in ``cwd``; killed (with its children) when it runs past ``timeout``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grtool", *argv], cwd=cwd, env=env if env is not None else os.environ.copy(),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        preexec_fn=_limit_memory,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        result = Result(list(argv), proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        result = Result(list(argv), None, out.decode(errors="replace"), err.decode(errors="replace"))
    if check and result.returncode != 0:
        raise AssertionError(result.describe())
    return result


@dataclass(frozen=True)
class Command:
    """A command that reads the run, and what its answer is: stdout, plus the files it (re)writes."""

    name: str
    argv: tuple[str, ...]
    answer_files: tuple[str, ...] = ()
    slow: bool = False  # loads the model's tokenizer (seconds): drawn rarely

    def answer(self, root: Path, result: Result) -> str:
        parts = [result.stdout]
        for name in self.answer_files:
            path = root / name
            parts.append(f"--- {name}\n" + (path.read_text(errors="replace") if path.is_file() else "(absent)"))
        return "\n".join(parts)


def commands(docid: str) -> dict[str, Command]:
    head = docid.split(",")[0]
    listing = [
        Command("status", ("status", "run", "--json")),
        Command("validate", ("validate", "run", "--json")),
        Command("stats", ("corpus", "stats", "run", "--json")),
        Command("query", ("index", "query", "run/index", docid, "--json")),
        Command("query-prefix", ("index", "query", "run/index", head + ",", "--prefix", "--json")),
        Command("index-stats", ("index", "stats", "run/index", "--json")),
        Command("recall", ("eval", "recall", "responses.jsonl", "--corpus", "run", "--triples", "run/triples", "--json")),
        Command("export-resume", ("export", "sft", "run/chains", "--corpus", "run", "--out", "run/export/sft.json", "--json"), ("run/export/sft.json",)),
        Command("index-resume", ("index", "build", "run/triples", "--tokenizer", "default", "--kind", "fm", "--out", "run/index", "--json"), slow=True),
        Command("dry-run", ("pipeline", "run", "p.toml", "--dry-run")),
        Command("pipeline-status", ("pipeline", "status", "p.toml")),
        Command("resume", ("pipeline", "run", "p.toml"), ("run/reports/recall.json", "run/reports/stats.json", "run/export/sft.json")),
        # retrieve opens and checks the index, then stops at the unknown split before loading the model's weights
        Command("retrieve", ("retrieve", "run", "--index", "run/index", "--markers", "brackets", "--split", "nosuch", "--out", "run/responses"), slow=True),
    ]
    return {c.name: c for c in listing}


# Which commands read which part of the run (by path prefix, relative to the example root).
READERS: list[tuple[str, tuple[str, ...]]] = [
    ("run/documents", ("status", "validate", "stats", "recall", "export-resume", "resume")),
    ("run/questions", ("status", "validate", "stats", "recall", "export-resume", "resume")),
    ("run/triples", ("status", "validate", "recall", "query", "index-resume", "resume")),
    ("run/chains", ("status", "validate", "export-resume", "resume")),
    ("run/index", ("query", "query-prefix", "index-stats", "validate", "index-resume", "resume", "retrieve")),
    ("run/export", ("validate", "export-resume", "resume")),
    ("run/_pipeline", ("dry-run", "pipeline-status", "resume")),
    # (the dry run and `pipeline status` show an edited report as a stage to run again: another answer, rightly)
    ("run/reports", ("resume",)),
    ("responses.jsonl", ("recall", "resume")),
    ("p.toml", ("dry-run", "pipeline-status")),
]


def readers(relpath: str) -> tuple[str, ...]:
    for prefix, names in READERS:
        if relpath == prefix or relpath.startswith(prefix + "/"):
            return names
    raise KeyError(relpath)


def check_properties(result: Result, intact: str | None, answer: Callable[[], str] | None) -> None:
    """DESIGN §8's rules as the fuzzer checks them: no hang, a documented exit code, no traceback, and exit 0 only
    with the intact run's answer (``intact`` None: the answer may differ, as after an edit that recomputed the
    digests of what it changed)."""
    assert result.returncode is not None, f"hung (killed after {HANG_SECONDS} s)\n{result.describe()}"
    assert result.returncode in EXIT_CODES, f"exit code {result.returncode} is none of {sorted(EXIT_CODES)}\n{result.describe()}"
    assert "Traceback (most recent call last)" not in result.stderr, f"traceback\n{result.describe()}"
    if result.returncode == 0 and intact is not None and answer is not None:
        got = answer()
        assert got == intact, f"exit 0 with another answer than the intact run's\n{result.describe()}\n--- intact answer:\n{intact[:3000]}\n--- this answer:\n{got[:3000]}"


# ---------------------------------------------------------------------------------------------- damaging JSON

# Values a JSON text cannot carry through json.dumps: written as raw tokens in place of a marker string.
RAW_TOKENS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity", "1e999": "1e999", "deep": "[" * 100_000 + "]" * 100_000, "bigint": "9" * 5000}
_MARK = "\u0000raw:"


def json_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and list indices) into ``value``, the whole document's () included."""
    paths = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            paths += json_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):  # the first few elements of long lists (qids, files) are enough
            paths += json_paths(v, prefix + (i,))
    return paths


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _other_type(value: Any) -> Any:
    """A value of another JSON type than ``value``."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return {"0": value[0] if value else None}
    if isinstance(value, dict):
        return list(value.values())
    return {}


# A damaging mutation leaves no valid record: a reader must refuse it or (an unknown key) ignore it, so exit 0
# comes only with the intact answer. The others can leave a valid record that says something else (a value of the
# right type, an optional key gone), so only the no-crash rules apply.
DAMAGING = ("wrong_type", "extra", "negative", "huge", "bigint", "nan", "inf", "-inf", "1e999", "deep")
JSON_MUTATIONS = ("wrong_type", "delete", "extra", "null", "negative", "zero", "huge", "bigint", "nan", "inf", "-inf", "1e999", "float", "empty", "swap", "deep", "long_string", "path_escape")


def mutate_json(doc: Any, path: tuple, kind: str, pick: int) -> Any:
    """``doc`` with the value at ``path`` damaged by ``kind`` (``pick`` chooses among siblings for swap).
    Returns the new document; raw tokens are markers that :func:`dump_json` writes unquoted."""
    if not path:
        return {"wrong_type": [doc], "extra": {**doc, "zz_extra": 1} if isinstance(doc, dict) else doc, "null": None,
                "deep": _MARK + "deep", "empty": {}}.get(kind, doc)  # fmt: skip
    parent = _get(doc, path[:-1])
    key = path[-1]
    old = parent[key]
    if kind == "wrong_type":
        parent[key] = _other_type(old)
    elif kind == "delete":
        del parent[key]
    elif kind == "extra":
        target = old if isinstance(old, dict) else parent if isinstance(parent, dict) else None
        if target is not None:
            target["zz_extra"] = {"unexpected": True}
        else:
            parent.append(old)  # a list grows by a duplicate
    elif kind == "null":
        parent[key] = None
    elif kind == "negative":
        parent[key] = -abs(old) - 1 if isinstance(old, (int, float)) and not isinstance(old, bool) else -1
    elif kind == "zero":
        parent[key] = 0
    elif kind == "huge":
        parent[key] = 2**64  # past every bound a count, a size or a duration has
    elif kind in ("bigint", "nan", "inf", "-inf", "1e999", "deep"):
        parent[key] = _MARK + kind
    elif kind == "float":
        parent[key] = (old + 0.5) if isinstance(old, (int, float)) and not isinstance(old, bool) else 0.5
    elif kind == "empty":
        parent[key] = type(old)() if isinstance(old, (str, list, dict)) else ""
    elif kind == "long_string":
        parent[key] = "x" * 100_000
    elif kind == "path_escape":
        parent[key] = "../../../../etc/passwd" if isinstance(old, str) or old is None else old
    elif kind == "swap":
        siblings = [k for k in (parent.keys() if isinstance(parent, dict) else range(len(parent))) if k != key]
        if siblings:
            other = siblings[pick % len(siblings)]
            parent[key], parent[other] = parent[other], old
    return doc


def dump_json(doc: Any) -> str:
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    return re.sub(r'"\\u0000raw:([a-z0-9-]+)"', lambda m: RAW_TOKENS[m.group(1)], text)


# Whole-file damage of a JSON record (its text, not one value).
TEXT_MUTATIONS = ("truncate", "empty_file", "not_utf8", "bom", "duplicate_key", "trailing_garbage", "whitespace_only", "nul_bytes")
# A key twice reads as its last value (here null): a valid record may remain. Every other text mutation leaves no
# JSON document at all (a cut can fall at the very end of a text: it then cuts only whitespace).
TEXT_DAMAGING = ("empty_file", "not_utf8", "bom", "trailing_garbage", "whitespace_only", "nul_bytes")


def position(data: bytes, at: float) -> int:
    """The byte at fraction ``at`` (0 <= at < 1) of ``data``: an example names a place relative to the file, so it
    damages the same part of a record on every machine (sizes differ: records hold absolute paths and times)."""
    return min(int(at * len(data)), max(0, len(data) - 1))


def mutate_text(data: bytes, kind: str, at: float) -> bytes:
    cut = position(data, at)
    if kind == "truncate":
        return data[:cut]
    if kind == "empty_file":
        return b""
    if kind == "not_utf8":
        return data[:cut] + b"\xff\xfe\xc3" + data[cut:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "duplicate_key":  # the first key again at the end, with another value
        m = re.search(rb'"([^"]+)":', data)
        return data.rstrip()[:-1] + (b', "' + m.group(1) + b'": null}' if m else b"}") if data.rstrip().endswith(b"}") else data
    if kind == "trailing_garbage":
        return data + b"\n{garbage"
    if kind == "whitespace_only":
        return b"  \n\t "
    if kind == "nul_bytes":
        return data[:cut] + b"\x00" * 16 + data[cut:]
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------- special files

SPECIAL_FILES = ("fifo", "directory", "dev_null", "dev_zero", "dangling_symlink", "symlink_loop", "empty", "socket_dir_swap")


def replace_with_special(path: Path, kind: str) -> None:
    """Put a special file where ``path`` (a file or a directory of the run) was."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev_null":
        path.symlink_to("/dev/null")
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "dangling_symlink":
        path.symlink_to(path.parent / "no-such-file")
    elif kind == "symlink_loop":
        path.symlink_to(path.name)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "socket_dir_swap":  # a directory holding a FIFO named like a record
        path.mkdir()
        os.mkfifo(path / "_manifest.json")
    else:
        raise ValueError(kind)


# ---------------------------------------------------------------------------------------------- content edited, digests recomputed


def _digests(data: bytes) -> dict[str, Any]:
    import blake3

    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "blake3": blake3.blake3(data).hexdigest()}


def edit_with_digests(root: Path, relpath: str, kind: str, at: float) -> None:
    """Damage the content of ``relpath`` (a shard, an index file, the export) at fraction ``at`` of it and recompute
    every digest and size the run's records hold of it, so that only reading the content can tell."""
    path = root / relpath
    data = path.read_bytes()
    cut = position(data, at)
    if kind == "flip":
        data = data[:cut] + bytes([data[cut] ^ 0xFF]) + data[cut + 1 :] if data else b"\x00"
    elif kind == "truncate":
        data = data[:cut]
    elif kind == "append":
        data = data + b"\x00\x01garbage"
    elif kind == "zero_block":
        data = data[:cut] + b"\x00" * min(64, len(data) - cut) + data[cut + 64 :]
    else:
        raise ValueError(kind)
    path.write_bytes(data)
    new = _digests(data)

    def fix(entries: list[dict]) -> None:
        for entry in entries:
            for key in ("bytes", "sha256", "blake3"):
                if key in entry:
                    entry[key] = new[key]

    stage = path.parent
    if (stage / "_manifest.json").is_file() and path.suffix == ".parquet":  # a shard: the manifest and its record
        manifest = json.loads((stage / "_manifest.json").read_text())
        fix([manifest["shards"][path.stem]])
        (stage / "_manifest.json").write_text(json.dumps(manifest, indent=2))
        record_path = stage / "_shards" / f"{path.stem}.json"
        record = json.loads(record_path.read_text())
        fix([record])
        record_path.write_text(json.dumps(record, indent=2))
    elif (stage / "index.json").is_file():
        record = json.loads((stage / "index.json").read_text())
        fix([record["files"][path.name]])
        (stage / "index.json").write_text(json.dumps(record, indent=2))
    sidecar = path.with_name(path.name + ".grtool.json")
    if sidecar.is_file():
        record = json.loads(sidecar.read_text())
        fix([record])
        sidecar.write_text(json.dumps(record, indent=2))


def files_of(root: Path, suffixes: tuple[str, ...] | None = None) -> list[str]:
    """The run's files (relative to ``root``), sorted by that relative name (the same list wherever the run lives),
    optionally only those ending in ``suffixes``."""
    found = []
    for p in root.rglob("*"):
        if p.is_file() and not p.name.endswith(".lock") and (suffixes is None or p.name.endswith(suffixes)):
            found.append(p.relative_to(root).as_posix())
    return sorted(found)
