"""A fuzzer of DESIGN §8's rules (issue #36): damage one piece of a small real run, run a command that reads it.

For every example the pristine run is copied to a fixed path, one thing is damaged — a value of a JSON record
(wrong type, missing, extra, negative, huge, NaN, swapped, nested 100,000 deep…), a record's whole text, a file
or directory replaced by a special file (FIFO, /dev/zero, a symlink loop…), a shard's or an index file's bytes
edited with every digest of them recomputed, an environment variable or a numeric option set to an edge value —
and one command that reads it runs in a subprocess. The properties, for every example:

- it finishes (no hang: killed after ``HANG_SECONDS``);
- its exit code is one of 0, 1, 2, 75 (a negative one is a crash by a signal);
- no traceback on stderr;
- exit 0 only with the intact run's answer (stdout, plus the files a resuming command rewrites), except after an
  edit whose digests were recomputed, where the content legitimately changed.

Examples are drawn deterministically (``derandomize``: a fixed seed per test), and every choice is relative to the
run — a file by its name inside the run, from a sorted list; a place in a file as a fraction of its length — so
every machine sees the same ones, though records hold absolute paths and times and sizes differ. For a longer, random
run locally: ``GRTOOL_FUZZ_EXAMPLES=500 python -m pytest -p no:cacheprovider tests/project/test_fuzz_records.py``
(every strategy gets that many examples, drawn at random; a failure prints the seed to reproduce it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fuzz_helpers import (
    DAMAGING, JSON_MUTATIONS, SPECIAL_FILES, TEXT_DAMAGING, TEXT_MUTATIONS, Command, build_run, check_properties, commands, dump_json,
    edit_with_digests, files_of, grtool, json_paths, mutate_json, mutate_text, readers, replace_with_special,
)  # fmt: skip

_EXAMPLES = os.environ.get("GRTOOL_FUZZ_EXAMPLES")


def fuzz_settings(examples: int):
    """``examples`` drawn the same way on every run (CI), or GRTOOL_FUZZ_EXAMPLES drawn at random (locally). Each
    example is a grtool subprocess (seconds): the fixed counts are a smoke sample that keeps `make test` short; the
    sweep is the local run with GRTOOL_FUZZ_EXAMPLES."""
    return settings(
        max_examples=int(_EXAMPLES) if _EXAMPLES else examples, derandomize=not _EXAMPLES, database=None, deadline=None,
        suppress_health_check=list(HealthCheck), print_blob=bool(_EXAMPLES),
        phases=[Phase.explicit, Phase.generate],  # no shrinking: an example is a handful of choices, printed as drawn
    )  # fmt: skip


class Fuzz:
    """The pristine run, the work path its copies live at, and every command's answer on it intact. (A plain class
    with a short repr: Hypothesis prints a failing example's arguments, dataclasses field by field.)"""

    def __init__(self, work: Path, pristine: Path, cache: Path, commands: dict[str, Command]):
        self.work, self.pristine, self.cache, self.commands = work, pristine, cache, commands
        self.intact: dict[str, str] = {}  # command name -> its exit code and answer on the intact run

    def __repr__(self) -> str:
        return f"Fuzz({self.work})"

    def reset(self) -> Path:
        """A fresh copy of the pristine run at the work path, and an empty lookup cache."""
        if self.work.exists():
            shutil.rmtree(self.work)
        shutil.copytree(self.pristine, self.work, symlinks=True)
        shutil.rmtree(self.cache / "lookups", ignore_errors=True)
        return self.work

    def env(self, **changes: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GRTOOL_", "SLURM_"))}
        env["GRTOOL_CACHE"] = str(self.cache)
        for k, v in changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env

    def run(self, name: str, env: dict[str, str] | None = None, answer_must_match: bool = True) -> None:
        """Run command ``name`` on the (damaged) work copy and check the properties."""
        command = self.commands[name]
        result = grtool(self.work, *command.argv, env=env or self.env())
        check_properties(result, self.intact[name] if answer_must_match else None, lambda: f"exit 0\n{command.answer(self.work, result)}")


def prepare(base: Path) -> Fuzz:
    """Build the run under ``base`` and record every command's answer on it intact."""
    from grtool.userinput import cache_root

    cache = base / "cache"
    cache.mkdir()
    # The embedded model's converted tokenizer is shared with the user's cache (converted once, hundreds of MB);
    # the lookup cache is the fuzzer's own, emptied for every example.
    models = cache_root() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (cache / "models").symlink_to(models)
    work = base / "work"
    work.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRTOOL_CACHE", str(cache))
        docid = build_run(work)
    fz = Fuzz(work, base / "pristine", cache, commands(docid))
    shutil.copytree(work, fz.pristine, symlinks=True)
    for name, command in fz.commands.items():
        fz.reset()
        result = grtool(work, *command.argv, env=fz.env())
        assert result.returncode is not None and "Traceback" not in result.stderr, result.describe()
        if name != "retrieve":  # retrieve stops at the unknown split on purpose (exit 2), after opening the index
            assert result.returncode == 0, result.describe()
        fz.intact[name] = f"exit {result.returncode}\n{command.answer(work, result)}"
    # The answers do not depend on when or where a copy runs (else the fuzzer would flag intact copies).
    for name in ("validate", "resume"):
        fz.reset()
        result = grtool(work, *fz.commands[name].argv, env=fz.env())
        assert f"exit {result.returncode}\n{fz.commands[name].answer(work, result)}" == fz.intact[name], result.describe()
    return fz


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory) -> Fuzz:
    return prepare(tmp_path_factory.mktemp("fuzz"))


class Draw:
    """What an example chooses: from Hypothesis's data (the tests) or from a seeded random (a longer local sweep
    that collects every failure instead of stopping at the first)."""

    def __init__(self, commands: dict[str, Command], data=None, rng=None):
        self.commands, self.data, self.rng, self.drawn = commands, data, rng, {}

    def one(self, label: str, options):
        options = list(options)
        value = self.data.draw(st.sampled_from(options), label=label) if self.data is not None else self.rng.choice(options)
        self.drawn[label] = value
        return value

    def number(self, label: str, low: int, high: int) -> int:
        value = self.data.draw(st.integers(low, high), label=label) if self.data is not None else self.rng.randint(low, high)
        self.drawn[label] = value
        return value

    def fraction(self, label: str) -> float:
        """A place in a file as a fraction of its length (in thousandths): the same part of the file on every
        machine, where an absolute offset would land elsewhere in a file of another size."""
        return self.number(label, 0, 999) / 1000

    def command_for(self, relpath: str) -> str:
        """A command that reads ``relpath``; the slow ones (they load the model's tokenizer) one time in six."""
        names = readers(relpath)
        slow = [n for n in names if self.commands[n].slow]
        if slow and self.number("slow", 0, 5) == 0:
            return self.one("command", slow)
        return self.one("command", [n for n in names if not self.commands[n].slow])


# JSON files of the run: every record grtool reads back, the export and the reports (not the tokenizer: the
# special files and the recomputed digests reach it).
def _json_files(root: Path) -> list[str]:
    return [f for f in files_of(root, (".json",)) if not f.endswith("tokenizer.json")]


def record_values(fuzz: Fuzz, draw: Draw) -> None:
    root = fuzz.reset()
    relpath = draw.one("file", _json_files(root))
    doc = json.loads((root / relpath).read_text())
    path = draw.one("json path", json_paths(doc))
    kind = draw.one("mutation", JSON_MUTATIONS)
    pick = draw.number("pick", 0, 50)
    (root / relpath).write_text(dump_json(mutate_json(doc, path, kind, pick)))
    # A stage's params are the options it ran with, free-form: any value there is a valid record of other options.
    damaging = kind in DAMAGING and not (relpath.endswith("_manifest.json") and path[:1] == ("params",))
    fuzz.run(draw.command_for(relpath), answer_must_match=damaging)


def record_text(fuzz: Fuzz, draw: Draw) -> None:
    root = fuzz.reset()
    relpath = draw.one("file", _json_files(root) + ["responses.jsonl", "p.toml"])
    kind = draw.one("mutation", TEXT_MUTATIONS)
    at = draw.fraction("at")
    path = root / relpath
    path.write_bytes(mutate_text(path.read_bytes(), kind, at))
    fuzz.run(draw.command_for(relpath), answer_must_match=kind in TEXT_DAMAGING)


_DIRECTORIES = ["run/documents", "run/questions/_shards", "run/triples", "run/chains/_shards", "run/index", "run/export", "run/_pipeline", "run/reports"]


def special_files(fuzz: Fuzz, draw: Draw) -> None:
    root = fuzz.reset()
    relpath = draw.one("path", files_of(root) + _DIRECTORIES)
    kind = draw.one("special file", SPECIAL_FILES)
    was_directory = (root / relpath).is_dir()
    replace_with_special(root / relpath, kind)
    # A dangling symlink is a missing file, and anything where a directory was is a missing stage, index or export
    # (nothing names them but their own records): a run may legitimately lack them (a stage not run yet). Every
    # other special file in place of a file is damage.
    damaging = kind != "dangling_symlink" and not was_directory
    fuzz.run(draw.command_for(relpath), answer_must_match=damaging)


def content_with_digests(fuzz: Fuzz, draw: Draw) -> None:
    root = fuzz.reset()
    relpath = draw.one("file", files_of(root, (".parquet", ".npy", ".txt")) + ["run/index/tokenizer.json", "run/export/sft.json"])
    kind = draw.one("edit", ("flip", "truncate", "append", "zero_block"))
    edit_with_digests(root, relpath, kind, draw.fraction("at"))
    fuzz.run(draw.command_for(relpath), answer_must_match=False)


# Every environment variable grtool reads (grep environ in grtool/), and the edge values they get.
ENVIRONMENT = ["GRTOOL_CACHE", "XDG_CACHE_HOME", "GRTOOL_PROGRESS_INTERVAL", "GRTOOL_LOOKUP_CACHE_GB", "GRTOOL_HOLD",
               "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "RANK", "WORLD_SIZE", "COLUMNS"]  # fmt: skip
EDGE_TEXT = ["", " ", "0", "-1", "1", "-0", "1e999", "nan", "inf", "-inf", "0x10", "1_000", "18446744073709551616",
             "9" * 400, "abc", "1.5", " 7 ", "/dev/null", "/nonexistent/dir", "no-colon", ":", "locked:", "x" * 5000]  # fmt: skip
_ENV_COMMANDS = ["status", "validate", "stats", "query", "index-stats", "recall", "export-resume", "dry-run", "pipeline-status", "resume", "ingest"]


def environment(fuzz: Fuzz, draw: Draw) -> None:
    name = draw.one("variable", ENVIRONMENT)
    value = draw.one("value", EDGE_TEXT)
    command = draw.one("command", _ENV_COMMANDS)
    if name == "GRTOOL_HOLD" and value.startswith("locked:") and value != "locked:":
        value = "locked:/nonexistent"  # a real hold point with a real directory would wait on purpose
    root = fuzz.reset()
    if command != "ingest":
        # COLUMNS is the terminal's width: tables legitimately lay out otherwise (the JSON answers stay).
        fuzz.run(command, env=fuzz.env(**{name: value}), answer_must_match=name != "COLUMNS")
        return
    # A writing command (it shards by SLURM_ARRAY_*: its output may differ), into a fresh directory.
    from conftest import EXAMPLES

    result = grtool(root, "corpus", "ingest", str(EXAMPLES / "musique"), "--out", "fresh/corpus", env=fuzz.env(**{name: value}))
    check_properties(result, None, None)
    if result.returncode == 2:
        assert not (root / "fresh/corpus").exists(), f"a refused environment variable left output behind\n{result.describe()}"


# Numeric options of commands that read the run (the output of the writing ones is fresh: an invalid option must
# leave nothing behind).
OPTIONS = [
    (("index", "query", "run/index", "{docid}", "--json"), "--limit"),
    (("index", "query", "run/index", "{head}", "--prefix", "--json"), "--ids"),
    (("index", "build", "run/triples", "--tokenizer", "llama3", "--kind", "trie", "--out", "fresh/index"), "--sample-rate"),
    (("index", "build", "run/triples", "--tokenizer", "llama3", "--kind", "fm", "--out", "fresh/index"), "--memory-limit"),
    (("export", "sft", "run/chains", "--corpus", "run", "--out", "fresh/sft.json"), "--max-per-dataset"),
    (("export", "sft", "run/chains", "--corpus", "run", "--out", "fresh/sft.json"), "--dev-share"),
    (("export", "sft", "run/chains", "--corpus", "run", "--out", "fresh/sft.json"), "--seed"),
    (("corpus", "ingest", "{examples}/musique", "--out", "fresh/corpus"), "--rows-per-part"),
    (("corpus", "overlap", "run", "--json"), "--n"),
    (("pipeline", "run", "p.toml", "--dry-run"), "--set"),
]
EDGE_NUMBERS = ["0", "-1", "1", "-0", "2", "9223372036854775808", "1" + "0" * 30, "1e999", "nan", "inf", "-inf", "0.5",
                "1e-320", "0x10", "1_000", "", " ", "abc", "99", "0.99", "1.0", "4-2", "0-0", "1-99999999", "1,,2"]  # fmt: skip


def numeric_options(fuzz: Fuzz, draw: Draw) -> None:
    from conftest import EXAMPLES

    root = fuzz.reset()
    argv, option = draw.one("command", OPTIONS)
    value = draw.one("value", EDGE_NUMBERS)
    docid = fuzz.commands["query"].argv[3]
    argv = [a.format(docid=docid, head=docid.split(",")[0], examples=EXAMPLES) for a in argv]
    if option == "--set":
        value = f"index.sample_rate={value}"
    result = grtool(root, *argv, option, value, env=fuzz.env())
    check_properties(result, None, None)
    out = root / argv[argv.index("--out") + 1] if "--out" in argv else None
    if result.returncode == 2 and out is not None:
        assert not out.exists(), f"a refused option left output behind\n{result.describe()}"


STRATEGIES = {"record_values": record_values, "record_text": record_text, "special_files": special_files,
              "content_with_digests": content_with_digests, "environment": environment, "numeric_options": numeric_options}  # fmt: skip


# ---------------------------------------------------------------------------------------------- the tests


@fuzz_settings(12)
@given(data=st.data())
def test_record_values(fuzz, data):
    """One value of one JSON record damaged: wrong type, missing, extra, null, negative, zero, huge, a 5000-digit
    integer, NaN, ±Infinity, 1e999, a fraction, empty, swapped with a sibling, 100,000 levels deep, very long, a
    path out of the run."""
    record_values(fuzz, Draw(fuzz.commands, data))


@fuzz_settings(6)
@given(data=st.data())
def test_record_text(fuzz, data):
    """A record's (or an input's) whole text damaged: cut short, emptied, invalid UTF-8, a byte-order mark, a key
    twice, garbage after the document, only whitespace, NUL bytes."""
    record_text(fuzz, Draw(fuzz.commands, data))


@fuzz_settings(8)
@given(data=st.data())
def test_special_files(fuzz, data):
    """A file or directory of the run, or an input, replaced by a FIFO, a directory, /dev/null, /dev/zero, a
    dangling symlink, a symlink to itself, an empty file, or a directory holding a FIFO."""
    special_files(fuzz, Draw(fuzz.commands, data))


@fuzz_settings(6)
@given(data=st.data())
def test_content_with_digests_recomputed(fuzz, data):
    """A shard, an index file or the export edited (a byte flipped, cut short, garbage appended, a block zeroed)
    and every size and digest the records hold of it recomputed: only reading the content can tell. The answer
    may change (the content did); a crash, a hang or a traceback may not."""
    content_with_digests(fuzz, Draw(fuzz.commands, data))


@fuzz_settings(8)
@given(data=st.data())
def test_environment(fuzz, data):
    """An environment variable set to an edge value: a usage error naming it, or the intact answer."""
    environment(fuzz, Draw(fuzz.commands, data))


@fuzz_settings(7)
@given(data=st.data())
def test_numeric_options(fuzz, data):
    """A numeric option at an edge value: a documented exit code, no traceback, and when the command refuses it,
    nothing of its output created."""
    numeric_options(fuzz, Draw(fuzz.commands, data))


# ---------------------------------------------------------------------------------------------- what it found


# The smallest examples of defects the fuzzer found, kept as plain tests once fixed: the damage done to the run
# (or None), the command, the environment it runs in, the exit code expected.
def _special(relpath: str, kind: str):
    return lambda root: replace_with_special(root / relpath, kind)


FOUND = {
    "memory-limit inf": (None, ("index", "build", "run/triples", "--tokenizer", "llama3", "--kind", "fm", "--out", "fresh/index", "--memory-limit", "inf"), {}, 2),
    "GRTOOL_HOLD malformed": (None, ("index", "stats", "run/index", "--json"), {"GRTOOL_HOLD": ":"}, 2),  # was a traceback while leaving
    # validate took the export for one without a record ("checked against its entry only") and passed
    "export record a directory": (_special("run/export/sft.json.grtool.json", "directory"), ("validate", "run", "--json"), {}, 1),
    # corpus stats passed the documents over as absent ("documents": null) and exited 0
    "manifest a FIFO": (_special("run/documents/_manifest.json", "fifo"), ("corpus", "stats", "run", "--json"), {}, 1),
    # the tokenizers library's bare Exception was a traceback from every command that opens the index
    "index tokenizer unreadable": (lambda root: edit_with_digests(root, "run/index/tokenizer.json", "zero_block", 0.633), ("index", "query", "run/index", "{docid}", "--json"), {}, 1),  # fmt: skip
}


@pytest.mark.parametrize("name", list(FOUND))
def test_found_by_the_fuzzer(fuzz, name):
    damage, argv, env, code = FOUND[name]
    root = fuzz.reset()
    if damage is not None:
        damage(root)
    result = grtool(root, *(a.format(docid=fuzz.commands["query"].argv[3]) for a in argv), env=fuzz.env(**env))
    check_properties(result, None, None)
    assert result.returncode == code, result.describe()
    assert not (root / "fresh").exists(), result.describe()


@pytest.mark.parametrize("output", ["run/reports/recall.json", "run/export/sft.json"])
def test_resume_checks_the_output_files_of_done_stages(fuzz, output):
    """DESIGN §8: a stage is complete only when the files its record names are there and match. Found by the fuzzer:
    an output cut short, then `pipeline run` says "done, skipped" and exits 0 with the damaged file in place."""
    root = fuzz.reset()
    path = root / output
    path.write_bytes(path.read_bytes()[:10])
    fuzz.run("resume")


def test_a_record_whose_text_is_not_utf8_is_damaged():
    """msgspec raises UnicodeDecodeError (no DecodeError) for such bytes inside a JSON string: it was a traceback
    from every record reader (found in `_pipeline/*.json`)."""
    from grtool.records import DamagedRecord, decode_record

    with pytest.raises(DamagedRecord, match=r"run/_pipeline/index.json: stage completion record is not UTF-8 text \(byte 11\) \(edited or damaged\)"):
        decode_record(b'{"stage": "\xff"}', dict, source="run/_pipeline/index.json", what="stage completion record")


# A 0xff byte inside a record's key that its declaration skips (an optional field's name damaged): msgspec skips the
# key without decoding it, so only the reader's own check of the whole text finds it. It was a traceback from
# `status` and `pipeline run`, and `validate` printed the decoder's words without the file.
STRAY_BYTE = {
    "status": ("run/documents/_manifest.json", b'"has_questions"', ("status", "run")),
    "validate": ("run/documents/_manifest.json", b'"has_questions"', ("validate", "run")),
    "pipeline run": ("run/triples/_shards/part-00000.json", b'"sha256"', ("pipeline", "run", "p.toml")),
}


@pytest.mark.parametrize("command", list(STRAY_BYTE))
def test_a_record_with_a_stray_byte_is_damaged_and_named(fuzz, command):
    relpath, key, argv = STRAY_BYTE[command]
    root = fuzz.reset()
    path = root / relpath
    data = path.read_bytes()
    at = data.index(key) + 3
    path.write_bytes(data[:at] + b"\xff" + data[at:])
    result = grtool(root, *argv, env=fuzz.env())
    check_properties(result, None, None)
    assert result.returncode == 1, result.describe()
    problems = [line for line in result.stderr.splitlines() if "not UTF-8" in line]
    assert len(problems) == 1 and f"{relpath}: " in problems[0] and f"(byte {at})" in problems[0], result.describe()
