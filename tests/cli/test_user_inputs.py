"""What users type (issue #36 §4, DESIGN §8): every number, path and environment variable is parsed once and
bounded; a wrong one is one line and exit 2 (a damaged stage: exit 1), never a traceback or a hang.

Real `grtool` subprocesses throughout; a subprocess timeout is only a guard against a hang, never a measurement."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import EXAMPLES, REPO, run_cli
from inprocess_helpers import grtool_run
from grtool.errors import InputError
from grtool.userinput import MAX_NESTING, VARIABLES, env, parse_number

HANG_GUARD = 120  # seconds: far past what any of these commands takes; only a hang reaches it
INPUT = EXAMPLES / "2wikimultihopqa"


def grtool(*args: str, env: dict | None = None, process: bool = False) -> subprocess.CompletedProcess:
    """`grtool ARGS`, its bytes arguments passed as they are (file names that are not UTF-8), in this process
    (tests/inprocess_helpers.py); ``process``: a child, where a hang is the failure looked for."""
    return grtool_run(args, env=env, text=False, process=process, timeout=HANG_GUARD)


def one_line(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """The run exited ``code`` with one error line holding every needle, and no traceback."""
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode("utf-8", "backslashreplace")
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err[-3000:]
    for needle in needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    return errors[0]


@pytest.fixture(scope="module")
def stage(tmp_path_factory) -> Path:
    """A small real run (documents/ and questions/ stages)."""
    out = tmp_path_factory.mktemp("run") / "corpus"
    run_cli("corpus", "ingest", INPUT, "--out", out)
    return out


# ------------------------------------------------------------------------------ numbers


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e400", "-5", "abc", "", "1" * 30, "0x10", "1.5", " 7", "7\n", "١", "Infinity"])
def test_the_number_parser_refuses_what_is_not_a_bounded_integer(text):
    with pytest.raises(ValueError, match="expected an integer"):
        parse_number(text, integer=True, low=0, high=100)


@pytest.mark.parametrize("text,value", [("7", 7), ("1e3", 1000), ("1_000", 1000)])
def test_the_number_parser_reads_integers_as_users_write_them(text, value):
    assert parse_number(text, integer=True, low=0) == value


@pytest.mark.parametrize("value", ["inf", "nan", "-5", "1e400", "abc", "99999999999999999999999", "0"])
def test_rows_per_part_out_of_bounds_is_one_usage_line(tmp_path, value):
    proc = grtool("corpus", "ingest", INPUT, "--out", tmp_path / "o", "--rows-per-part", value)
    one_line(proc, 2, "--rows-per-part", repr(value))
    assert not (tmp_path / "o").exists()  # refused before anything is written


@pytest.mark.parametrize("args", [
    ["filters", "apply", "CHAINS", "--corpus", "C", "--out", "O", "--min-recall", "nan"],
    ["export", "kto", "R", "--corpus", "C", "--out", "O", "--tau", "inf"],
    ["export", "sft", "C", "--out", "O", "--seed", "-1"],
    ["show", "X", "--limit", "1e400"],
    ["retrieve", "--max-empty-share", "-inf"],
    ["train", "sft", "D", "--out", "O", "--learning-rate", "nan"],
    ["chains", "synthesize", "--top-p", "1e400"],
])  # fmt: skip
def test_float_and_seed_options_refuse_inf_nan_and_negatives(tmp_path, args):
    proc = grtool(*[str(tmp_path / a) if a.isupper() else a for a in args])
    one_line(proc, 2, args[-2])


def test_every_numeric_option_of_every_command_goes_through_the_parser():
    """Walk the real command tree: each int/float parameter refuses NaN, infinity and 10**30 (a command added
    later without its own line is covered too)."""
    import typer

    from grtool.cli.main import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    checked = []

    def walk(command, path):
        for name in getattr(command, "commands", {}):
            walk(root.get_command(ctx, name) if command is root else command.commands[name], [*path, name])
        for param in command.params:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if annotation not in (int, float):
                continue
            for bad in ("nan", "inf", "1e30" if annotation is float else "1" * 30):
                with pytest.raises(InputError, match=re.escape(max(param.opts, key=len))):
                    param.process_value(command.context_class(command), bad)
            checked.append((" ".join(path), param.name))

    walk(root, [])
    assert len(checked) > 40, checked  # the tree was walked: grtool has dozens of numeric options


# ------------------------------------------------------------------------- environment


NUMERIC_VARIABLES = ["GRTOOL_LOOKUP_CACHE_GB", "GRTOOL_PROGRESS_INTERVAL", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID",
                     "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP", "WORLD_SIZE", "RANK", "COLUMNS"]  # fmt: skip


@pytest.mark.parametrize("name", NUMERIC_VARIABLES)
@pytest.mark.parametrize("value", ["inf", "nan", "-5", "1e400", "abc"])
def test_a_wrong_numeric_variable_stops_every_command_in_one_line(stage, tmp_path, name, value):
    proc = grtool("status", stage, env={name: value})
    one_line(proc, 2, name, repr(value), "expected")


@pytest.mark.parametrize("name", NUMERIC_VARIABLES)
def test_an_empty_variable_is_an_unset_one(stage, name):
    assert grtool("status", stage, env={name: ""}).returncode == 0


def test_a_wrong_variable_stops_a_writing_command_before_it_writes(tmp_path):
    proc = grtool("corpus", "ingest", INPUT, "--out", tmp_path / "o", env={"GRTOOL_PROGRESS_INTERVAL": "inf"})
    one_line(proc, 2, "GRTOOL_PROGRESS_INTERVAL")
    assert not (tmp_path / "o").exists()


def test_the_hold_variable_is_checked_and_an_unwritable_cache_is_not_refused(stage, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert grtool("status", stage, env={"GRTOOL_CACHE": str(a_file)}).returncode == 0  # unwritable: read as it is
    one_line(grtool("status", stage, env={"GRTOOL_HOLD": "nocolon"}), 2, "GRTOOL_HOLD", "POINT:DIRECTORY")


def test_a_secret_variable_is_never_shown(monkeypatch):
    assert VARIABLES["OPENAI_API_KEY"].secret
    assert env("OPENAI_API_KEY") is None or isinstance(env("OPENAI_API_KEY"), str)


@pytest.mark.parametrize("count,task,first,step,expected", [
    ("4", "2", None, None, (4, 2)),
    ("3", "12", "10", None, (3, 2)),  # --array=10-12
    ("5", "8", "0", "2", (5, 4)),  # --array=0-8:2
])  # fmt: skip
def test_slurm_array_tasks_map_to_shards(monkeypatch, count, task, first, step, expected):
    from grtool.store.sharding import resolve_sharding

    for name, value in (("SLURM_ARRAY_TASK_COUNT", count), ("SLURM_ARRAY_TASK_ID", task), ("SLURM_ARRAY_TASK_MIN", first), ("SLURM_ARRAY_TASK_STEP", step)):
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    assert resolve_sharding(None, None) == expected


@pytest.mark.parametrize("count,task,first,step,needle", [
    ("3", "3", None, None, "SLURM_ARRAY_TASK_ID=3"),  # an id past the count
    (None, "0", None, None, "SLURM_ARRAY_TASK_COUNT is not"),
    ("3", "1", "2", None, "SLURM_ARRAY_TASK_MIN=2"),  # an id below the array's first
    ("5", "3", "0", "2", "SLURM_ARRAY_TASK_STEP=2"),  # an id off the step
    ("0", "0", None, None, "SLURM_ARRAY_TASK_COUNT='0'"),
    ("3", "-1", None, None, "SLURM_ARRAY_TASK_ID='-1'"),
    ("x", "0", None, None, "SLURM_ARRAY_TASK_COUNT='x'"),
])  # fmt: skip
def test_slurm_array_variables_that_do_not_fit_are_usage_errors(monkeypatch, count, task, first, step, needle):
    from grtool.store.sharding import resolve_sharding

    for name, value in (("SLURM_ARRAY_TASK_COUNT", count), ("SLURM_ARRAY_TASK_ID", task), ("SLURM_ARRAY_TASK_MIN", first), ("SLURM_ARRAY_TASK_STEP", step)):
        monkeypatch.delenv(name, raising=False) if value is None else monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=re.escape(needle)):
        resolve_sharding(None, None)


def test_a_slurm_id_past_the_count_stops_the_cli_in_one_line(stage, tmp_path):
    proc = grtool("chains", "gold", stage, "--triples", stage, "--out", tmp_path / "g", env={"SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "2"})
    assert proc.returncode in (1, 2) and b"Traceback" not in proc.stderr


def test_every_variable_is_documented_and_every_documented_variable_is_read():
    page = (REPO / "docs" / "reference" / "environment.md").read_text()
    listed = {name for line in page.splitlines() if line.startswith("| `") for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])}
    assert listed == set(VARIABLES), f"documented only: {listed - set(VARIABLES)}; read only: {set(VARIABLES) - listed}"


def test_no_module_reads_the_environment_past_the_registry():
    """Only grtool.userinput parses variables; a read elsewhere is either a write, a variable named by the user
    (--api-key-env) or a presence test."""
    allowed = {"grtool/userinput.py", "grtool/holds.py", "grtool/llm/openai_backend.py"}
    found = []
    for f in (REPO / "grtool").rglob("*.py"):
        rel = f.relative_to(REPO).as_posix()
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"os\.environ(\.get\(|\[)|os\.getenv\(", line) and rel not in allowed and "setdefault" not in line:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, found


# -------------------------------------------------------------------------------- paths


def test_a_fifo_as_an_input_is_named_as_one(tmp_path):
    fifo = tmp_path / "questions.json"
    os.mkfifo(fifo)
    one_line(grtool("corpus", "ingest", fifo, "--out", tmp_path / "o", process=True), 2, "FIFO")
    one_line(grtool("validate", fifo, process=True), 2, "FIFO")


def test_a_device_as_an_input_is_named_as_one(tmp_path):
    one_line(grtool("corpus", "ingest", "/dev/null", "--out", tmp_path / "o"), 2, "/dev/null", "character device")


def test_a_closed_file_descriptor_is_named_as_one(tmp_path):
    fd = 200
    while os.path.exists(f"/dev/fd/{fd}"):
        fd += 1
    one_line(grtool("corpus", "ingest", f"/dev/fd/{fd}", "--out", tmp_path / "o"), 2, f"file descriptor {fd} is not open")


def test_a_dangling_link_is_named_as_one(tmp_path):
    (tmp_path / "link.json").symlink_to(tmp_path / "gone.json")
    one_line(grtool("corpus", "ingest", tmp_path / "link.json", "--out", tmp_path / "o"), 2, "symbolic link")


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_shard_that_is_not_a_file_is_damaged_never_a_hang(stage, tmp_path, kind):
    run = tmp_path / "run"
    shutil.copytree(stage, run)
    shard = run / "documents" / "part-00000.parquet"
    shard.unlink()
    shard.mkdir() if kind == "directory" else os.mkfifo(shard)
    proc = grtool("validate", run, process=True)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert kind.encode() in proc.stderr and b"part-00000.parquet" in proc.stderr
    assert grtool("status", run, process=True).returncode in (0, 1)
    one_line(grtool("corpus", "stats", run, process=True), 1, "part-00000.parquet", kind, "damaged")


def test_stages_under_a_directory_whose_name_is_not_utf8_read(stage, tmp_path):
    odd = os.fsencode(tmp_path) + b"/r\xff\xfe"
    shutil.copytree(stage, os.fsdecode(odd))
    for command in (["validate"], ["status"], ["corpus", "stats"]):
        proc = grtool(*command, odd)
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_input_file_whose_name_is_not_utf8_is_ingested(tmp_path):
    folder = os.fsencode(tmp_path) + b"/in\xff"
    os.mkdir(folder)
    shutil.copy(INPUT / "dev.example.json", os.fsdecode(folder + b"/dev\xfe.json"))
    proc = grtool("corpus", "ingest", folder, "--out", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert grtool("validate", tmp_path / "o").returncode == 0
    proc = grtool("corpus", "ingest", folder + b"/dev\xfe.json", "--out", tmp_path / "o2")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_output_whose_name_is_not_utf8_is_one_line(tmp_path):
    proc = grtool("corpus", "ingest", INPUT, "--out", os.fsencode(tmp_path) + b"/o\xff")
    one_line(proc, 2, "UTF-8")


def test_index_build_reads_triples_under_a_name_that_is_not_utf8(tmp_path):
    from index_helpers import BUNDLED, write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    odd = os.fsdecode(os.fsencode(tmp_path) + b"/t\xff")
    write_triples_stage(tmp_path / "t" / "triples", rows)  # grtool writes only UTF-8 names; the user renames
    os.rename(tmp_path / "t", odd)
    proc = grtool("index", "build", odd, "-t", "llama3", "--out", tmp_path / "idx")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory; the mode cannot refuse it")
def test_a_read_only_output_directory_is_one_line(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        one_line(grtool("corpus", "ingest", INPUT, "--out", parent / "o"), 2, str(parent / "o"))
    finally:
        parent.chmod(0o755)


def test_an_output_on_a_read_only_file_system_is_one_line(tmp_path):
    """/proc is read-only for everyone, root included."""
    one_line(grtool("corpus", "ingest", INPUT, "--out", "/proc/grtool-test-out"), 2, "/proc/grtool-test-out")


# ------------------------------------------------------------------------- nested JSON


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("layout", ["array", "lines"])
@pytest.mark.parametrize("levels", [MAX_NESTING + 5, 100_000])
def test_deeply_nested_records_are_one_line_naming_the_record(tmp_path, layout, levels):
    good = {"qid": "q1", "question": "Who?", "answer": "x", "gold_titles": ["A"]}
    deep = '{"qid": "q2", "question": "Deep?", "answer": "x", "gold_titles": ["A"], "extra": ' + _deep(levels) + "}"
    f = tmp_path / f"questions_dev.{'json' if layout == 'array' else 'jsonl'}"
    f.write_text(f"[{json.dumps(good)},\n{deep}]" if layout == "array" else f"{json.dumps(good)}\n{deep}\n")
    proc = grtool("corpus", "ingest", f, EXAMPLES / "generic" / "documents.jsonl", "--dataset", "generic", "--out", tmp_path / "o")
    one_line(proc, 2, f.name, "record 2" if layout == "array" else "line 2", "nested deeper")


def test_a_deep_record_in_a_release_file_is_one_line(tmp_path):
    f = tmp_path / "hotpot_dev_distractor_v1.json"
    f.write_text('[{"_id": "a", "question": "q", "answer": "a", "supporting_facts": [], "type": "x", "level": "y", "context": ' + _deep(100_000) + "}]")
    one_line(grtool("corpus", "ingest", f, "--out", tmp_path / "o"), 2, "record 1", "nested deeper")


# ----------------------------------------------------------------------------- queries


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    from index_helpers import BUNDLED, write_triples_stage

    base = tmp_path_factory.mktemp("index")
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(base / "triples", rows)
    run_cli("index", "build", base / "triples", "-t", "llama3", "--out", base / "idx")
    return base / "idx"


@pytest.mark.parametrize("query,lang", [(b"\xff\xfe", None), (b"caf\xc3\xa9", "C"), (b"\xed\xa0\x80", None), (b"a\x00"[:1] + b"\x1b[31m", None)])
def test_queries_of_any_bytes_work_or_are_usage_errors(index, query, lang):
    proc = grtool("index", "query", index, query, env={"LC_ALL": lang} if lang else None)
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr
    if proc.returncode == 2:
        one_line(proc, 2)


# ------------------------------------------------------------------- file systems that refuse


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of our own (mounting needs root and the capability; skipped where refused)."""
    mount = tmp_path / "fs"
    mount.mkdir()

    def make(options: str) -> Path:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
        return mount

    yield make
    subprocess.run(["umount", str(mount)], capture_output=True)


def test_an_output_on_a_read_only_mount_is_one_line(small_fs):
    mount = small_fs("ro,size=1m")
    one_line(grtool("corpus", "ingest", INPUT, "--out", mount / "o"), 2, str(mount / "o"), "ead-only file system")


def test_a_read_only_cache_is_one_line(small_fs, tmp_path):
    mount = small_fs("ro,size=1m")
    from index_helpers import BUNDLED, write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(tmp_path / "t" / "triples", rows)
    proc = grtool("index", "build", tmp_path / "t", "-t", "SmolLM2-135M-Instruct", "--out", tmp_path / "idx", env={"GRTOOL_CACHE": str(mount / "cache")})
    one_line(proc, 2, "read-only")


def test_exhausted_inodes_are_named(small_fs):
    mount = small_fs("size=10m,nr_inodes=40")
    n = 0
    try:
        while True:
            (mount / f"f{n}").touch()
            n += 1
    except OSError:
        pass
    for i in range(3):  # room for the output directory, not for the run's files
        (mount / f"f{i}").unlink()
    one_line(grtool("corpus", "ingest", INPUT, "--out", mount / "o"), 1, "no inodes left", "remove files")


@pytest.mark.parametrize("line", ["learning_rate: .inf", "learning_rate: .nan", "learning_rate: 1e400", "epochs: -5.0", "max_steps: 2.5", "max_steps: 100000000000000000000000"])
def test_train_config_file_numbers_are_finite_and_bounded(tmp_path, line):
    from grtool.train.config import resolve

    config = tmp_path / "train.yaml"
    config.write_text(line + "\n")
    key = line.split(":")[0]
    with pytest.raises(InputError, match=key.replace("_", "[-_]")):  # the key, or the option it sets (--learning-rate)
        resolve("sft", {}, config)


@pytest.mark.parametrize("name", ["a\nb.json", "a\x1b[31mred.json", "tab\there.json"])
def test_a_path_with_control_characters_stays_on_one_line(tmp_path, name):
    one_line(grtool("corpus", "ingest", tmp_path / name, "--out", tmp_path / "o"), 2, "no such file or directory")


@pytest.mark.parametrize("ids", ["9" * 30, "1,inf", "1,nan", "1,1e400", "١٢"])
def test_index_query_ids_are_bounded_token_ids(ids):
    from grtool.index.query import parse_ids

    with pytest.raises(InputError, match="--ids"):
        parse_ids(ids)


@pytest.mark.parametrize("spec", ["1-100000000", "0-3", "4-inf", "nan", "9" * 30, "5-4"])
def test_overlap_sizes_are_bounded(spec):
    from grtool.corpus.overlap import parse_ns

    with pytest.raises(InputError, match="--n"):
        parse_ns(spec)


@pytest.mark.parametrize("command", [["pipeline", "run", "{}"], ["eval", "compare", "a={}", "b={}"], ["show", "{}"], ["status", "{}"],
                                     ["train", "sft", "{}", "--out", "OUT", "--dry-run"], ["index", "build", "{}", "-t", "llama3", "--out", "OUT"],
                                     ["corpus", "merge", "{}", "--out", "OUT"]])  # fmt: skip
@pytest.mark.parametrize("special", ["fifo", "/dev/null"])
def test_special_files_given_to_any_reader_are_named_never_waited_on(tmp_path, command, special):
    path = tmp_path / "special"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path = Path(special)
    args = [a.replace("{}", str(path)).replace("OUT", str(tmp_path / "o")) for a in command]
    one_line(grtool(*args), 2, "FIFO" if special == "fifo" else "character device")


def test_an_index_record_with_a_key_given_twice_is_one_line(index, tmp_path):
    """index.json edited to give ``build_seconds`` twice: which value was meant is unknown, so the record is
    damaged (before: the last value was read, exit 0)."""
    import shutil

    copy = tmp_path / "idx"
    shutil.copytree(index, copy)
    record = copy / "index.json"
    record.write_text(record.read_text().replace("{", '{"build_seconds": 99.5, ', 1))
    one_line(grtool("index", "query", copy, "Paris"), 1, "index.json", "field build_seconds is given twice")
