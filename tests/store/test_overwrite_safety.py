"""Issue 25, items 1, 2 and 4: what --overwrite may delete, outputs that are inputs, one writer per output.

Real CLI runs in subprocesses on a real ingest of the samples corpus (the `samples` fixture, tests/sample_helpers.py:
documents, questions and a triples stage), a filtered-chains stage and a base-model directory with the
embedded model's tokenizer. Every refusal is exit 2 and leaves every file as it was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from grtool.store.locks import beside_lock, output_lock
from grtool.store.outputs import export_record
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter
from sample_helpers import write_chains
from train_helpers import write_sft
from output_helpers import one_line, snapshot


@pytest.fixture(scope="module")
def run(samples, tmp_path_factory) -> dict:
    """A copy of the sample run directory (documents/, questions/, triples/, a user's notes.txt), a filtered
    chains stage, a base model directory and SFT data, shared by the tests (the refused runs change nothing)."""
    base = tmp_path_factory.mktemp("overwrite")
    root = base / "RUN"
    shutil.copytree(samples["root"], root)
    (root / "notes.txt").write_text("my notes about this run\n")
    write_chains(samples, base / "filtered")
    from grtool.models import resolve_model

    model = base / "base-model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"):
        shutil.copy(Path(resolve_model(None).path) / name, model / name)
    (model / "model.safetensors").symlink_to(Path(resolve_model(None).path) / "model.safetensors")  # a model folder has weights
    return {"root": root, "filtered": base / "filtered", "model": model, "sft": write_sft(base / "thinkgr_sft.json", n=4)}


def index_build(run: dict, out: Path, *extra) -> tuple:
    return ("index", "build", run["root"] / "triples", "--tokenizer", "llama3", "--kind", "numpy", "--out", out, *extra)


def filters_apply(run: dict, out: Path, *extra) -> tuple:
    # --allow-empty: the sample chains do not pass the filters, and what is tested here is where the output goes
    return ("filters", "apply", run["filtered"], "--corpus", run["root"], "--triples", run["root"], "--out", out, "--allow-empty", *extra)


def train_sft(run: dict, out: Path, *extra) -> tuple:
    return ("train", "sft", run["sft"], "--model", run["model"], "--out", out, "--max-steps", "1", "--cutoff-len", "256", "--per-device-batch-size", "2", *extra)


def export_gmr(run: dict, out: Path, *extra) -> tuple:
    return ("export", "gmr", run["root"], "--out", out, *extra)


def export_sft(run: dict, out: Path, *extra) -> tuple:
    return ("export", "sft", run["filtered"], "--corpus", run["root"], "--out", out, *extra)


def refused(args: tuple, *watched: Path, code: int = 2, process: bool = False) -> str:
    """Run ``args``: exit ``code``, one `error:` line, every watched file unchanged. Returns stderr on one line."""
    before = [snapshot(w) for w in watched]
    proc = run_cli(*args, check=code, process=process)
    assert [snapshot(w) for w in watched] == before
    err = one_line(proc.stderr)
    assert "error:" in err and "Traceback" not in err
    return err


# ------------------------------------------------------------------ 1: --overwrite deletes only its own


def test_the_issue_index_build_over_the_run_directory_deletes_nothing(run):
    """`index build RUN/documents --source documents --out RUN --overwrite` deleted RUN with its stages and notes."""
    root = run["root"]
    args = ("index", "build", root / "documents", "--source", "documents", "--tokenizer", "llama3", "--out", root, "--overwrite")
    err = refused(args, root)
    assert f"--out {root}: contains the input {root / 'documents'}" in err


UNKNOWN = {  # command, what its refusal says is missing
    "index build": (index_build, "no index.json"),
    "filters apply": (filters_apply, "no _manifest.json"),
    "train sft": (train_sft, "no grtool.json"),
}


@pytest.mark.parametrize("command", sorted(UNKNOWN))
def test_overwrite_of_an_unknown_non_empty_directory_is_refused(run, tmp_path, command):
    make, missing = UNKNOWN[command]
    mine = tmp_path / "mine"
    (mine / "photos").mkdir(parents=True)
    (mine / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 a cat")
    (mine / "thesis.tex").write_text("\\chapter{One}\n")
    err = refused(make(run, mine, "--overwrite"), mine)
    assert "--overwrite refused" in err and f"holds photos/, thesis.tex and {missing}" in err


@pytest.mark.parametrize("command", ["index build", "filters apply"])
def test_overwrite_of_a_stage_of_another_table_is_refused(run, tmp_path, command):
    """A triples stage given as the output of a chains command (or of an index build)."""
    other = tmp_path / "triples-copy"
    shutil.copytree(run["root"] / "triples", other)
    make, _ = UNKNOWN[command]
    err = refused(make(run, other, "--overwrite"), other)
    if command == "filters apply":
        assert "a stage directory of table 'triples', and this command writes 'chains'" in err
    else:
        assert "--overwrite refused" in err and "_manifest.json" in err


def test_train_out_naming_the_base_model_is_refused(run):
    model = run["model"]
    for extra in (("--overwrite",), ("--dry-run",)):
        err = refused(train_sft(run, model, *extra), model)
        assert f"--out {model}: is the input {model}" in err


@pytest.mark.parametrize("command", ["index build", "filters apply"])
def test_overwrite_keeps_an_unknown_file_beside_the_outputs_own_files(run, tmp_path, command):
    make, _ = UNKNOWN[command]
    out = tmp_path / "out"
    run_cli(*make(run, out))
    (out / "notes.txt").write_text("keep me\n")
    (out / "part-notes").mkdir()  # a name close to grtool's own, still not one it writes
    proc = run_cli(*make(run, out, "--overwrite"))
    assert (out / "notes.txt").read_text() == "keep me\n" and (out / "part-notes").is_dir()
    assert "--overwrite left 2 entries grtool did not write: notes.txt, part-notes/" in one_line(proc.stderr)
    run_cli("validate", out) if command == "filters apply" else run_cli("index", "stats", out)


def test_overwrite_keeps_the_users_files_inside_the_stages_own_folders(run, tmp_path):
    """--overwrite emptied _rejects/ and _shards/ of everything in them, a user's notes too: only what grtool
    writes there goes (at any depth), and the stage is whole again."""
    out = tmp_path / "out"
    run_cli(*filters_apply(run, out))
    (out / "_rejects" / "notes.txt").write_text("keep me\n")
    (out / "_shards" / "mine").mkdir()
    (out / "_shards" / "mine" / "part-00000.json").write_text("{}")  # named like grtool's, one level down
    proc = run_cli(*filters_apply(run, out, "--overwrite"))
    assert (out / "_rejects" / "notes.txt").read_text() == "keep me\n"
    assert (out / "_shards" / "mine" / "part-00000.json").read_text() == "{}"
    assert "--overwrite left 2 entries grtool did not write: _rejects/notes.txt, _shards/mine/" in one_line(proc.stderr)
    run_cli("validate", out)


def test_ingest_clears_only_its_own_files_from_its_work_folder(tmp_path):
    """`corpus ingest` spills into OUT/_ingest_work and removed the folder whole when done (and on --overwrite):
    a user's file put there went with it. Only the plan, the rejects and the buckets go; the user's file stays,
    named, with the folder."""
    from paths_helpers import EXAMPLES

    out = tmp_path / "corpus"
    args = ("corpus", "ingest", EXAMPLES / "2wikimultihopqa", "--out", out)
    run_cli(*args)
    (out / "_ingest_work" / "documents").mkdir(parents=True)
    (out / "_ingest_work" / "notes.txt").write_text("keep me\n")
    (out / "_ingest_work" / "documents" / "bucket-notes.arrow").write_text("mine too\n")  # like grtool's, not its name
    proc = run_cli(*args, "--overwrite")
    assert (out / "_ingest_work" / "notes.txt").read_text() == "keep me\n"
    assert (out / "_ingest_work" / "documents" / "bucket-notes.arrow").read_text() == "mine too\n"
    assert sorted(p.name for p in (out / "_ingest_work").rglob("*")) == ["bucket-notes.arrow", "documents", "notes.txt"]  # no spill left
    assert "kept 2 entries grtool did not write there" in one_line(proc.stderr)
    run_cli("validate", out)
    # a link named like grtool's bucket folder goes, never written through (before: the spill wrote into its target)
    shutil.rmtree(out / "_ingest_work")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "bucket-0000.arrow").write_text("my data\n")
    (out / "_ingest_work").mkdir()
    (out / "_ingest_work" / "documents").symlink_to(tmp_path / "mine")
    run_cli(*args, "--overwrite")
    assert (tmp_path / "mine" / "bucket-0000.arrow").read_text() == "my data\n" and not (out / "_ingest_work").exists()
    # a file where the work folder goes: named, exit 2 (before: a FileExistsError traceback)
    (out / "_ingest_work").write_text("notes\n")
    assert "_ingest_work: a file where grtool keeps a run's work folder" in refused((*args, "--overwrite"), out / "_ingest_work")


def test_overwrite_of_an_index_replaces_its_files_and_keeps_the_users(run, tmp_path):
    out = tmp_path / "idx"
    run_cli(*index_build(run, out))
    (out / "notes.txt").write_text("keep me\n")
    first = (out / "index.json").read_bytes()
    run_cli(*index_build(run, out, "--overwrite"))
    assert (out / "index.json").read_bytes() != first and (out / "notes.txt").is_file()
    assert not list(tmp_path.glob(".idx*")), "no build directory or lock file left beside the index"


# --------------------------------------------------------------------------- 2: an output is an input


INPUT_AS_OUTPUT = {  # name -> (args, the input it hits, what the message says)
    "export gmr onto a questions shard": (lambda r: export_gmr(r, r["root"] / "questions" / "part-00000.parquet"), "questions, a stage directory grtool wrote"),
    "export sft onto a chains shard": (lambda r: export_sft(r, r["filtered"] / "part-00000.parquet"), "lies inside the input"),
    "filters apply into its chains": (lambda r: filters_apply(r, r["filtered"]), "is the input"),
    "filters apply over the run": (lambda r: filters_apply(r, r["root"].parent, "--overwrite"), "contains the input"),
    "filters --report onto a shard": (lambda r: filters_apply(r, r["root"].parent / "f2", "--report", r["filtered"] / "part-00000.parquet"), "lies inside the input"),
    "index build inside its triples": (lambda r: index_build(r, r["root"] / "triples" / "idx"), "lies inside the input"),
    "train onto its data": (lambda r: train_sft(r, r["sft"], "--format", "llamafactory-yaml"), "is the input"),
}


@pytest.mark.parametrize("case", sorted(INPUT_AS_OUTPUT))
def test_an_output_that_is_an_input_or_holds_one_is_refused(run, case):
    make, says = INPUT_AS_OUTPUT[case]
    args = make(run)
    err = refused(args, run["root"], run["filtered"], run["sft"])
    assert says in err
    assert not (run["root"].parent / "f2").exists()  # refused before anything was created


def test_an_output_reached_through_a_symlink_is_still_the_input(run, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(run["root"] / "questions")
    err = refused(export_gmr(run, link / "part-00000.parquet"), run["root"])
    assert f"lies inside {(run['root'] / 'questions').resolve()}, a stage directory grtool wrote" in err


def test_export_replaces_only_its_own_exports(run, tmp_path):
    out = tmp_path / "pairs.jsonl"
    out.write_text("my own file\n")
    err = refused(export_gmr(run, out), out)
    assert "pairs.jsonl.grtool.json" in err
    out.unlink()
    run_cli(*export_gmr(run, out))
    run_cli(*export_gmr(run, out))  # its own export: replaced
    assert "is a gmr export, not sft" in refused(export_sft(run, out), out)
    # before: the report's page replaced the export (its record says grtool wrote the file), exit 0
    assert "is an export grtool wrote (pairs.jsonl.grtool.json beside it)" in refused(("report", run["root"], "--out", out), out)


# ------------------------------------------------------------------------------ 4: one writer per output


def test_two_index_builds_into_one_out_the_second_is_refused_naming_the_first(tmp_path):
    """The first build is held right after it took the lock beside --out (grtool.holds), so the second meets a live
    run whatever the machine's load; stopped there, the first leaves no index."""
    rows = [{"doc_id": f"d{i // 4:06d}", "idx": i % 4, "head": f"Person {i}", "relation": "place of birth", "tail": f"City {i % 977}",
             "docid": f"<docid_start>Person {i}, place of birth, City {i % 977}<docid_end>"} for i in range(400)]  # fmt: skip
    stage = StageWriter(tmp_path / "triples", StageSpec("triples", TRIPLES), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()
    out = tmp_path / "idx"
    holds = tmp_path / "holds"
    holds.mkdir()
    args = ["index", "build", str(tmp_path / "triples"), "--tokenizer", "llama3", "--out", str(out)]
    first = subprocess.Popen([sys.executable, "-m", "grtool", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "GRTOOL_HOLD": f"locked:{holds}"})  # fmt: skip
    try:
        while not (holds / "locked.reached").is_file():  # a state, not a time: it gets there or ends (then fails)
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = run_cli(*args, "--overwrite", check=75)  # held by a live run: try again later
        assert first.poll() is None, "the first build must still be held"
    finally:
        first.terminate()
        first.communicate(timeout=60)
    assert first.returncode == 75
    err = one_line(second.stderr)
    assert f"pid {first.pid} on host" in err and "index build" in err and "wait until that run ends" in err
    assert not out.exists()


def _held_at_locked(args: list, holds: Path, meanwhile) -> subprocess.CompletedProcess:
    """Run ``grtool args`` until it holds its output's lock, do ``meanwhile()``, let it go on; its result."""
    holds.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GRTOOL_HOLD": f"locked:{holds}", "COLUMNS": "10000"})  # fmt: skip
    try:
        while not (holds / "locked.reached").is_file():  # a state, not a time: it gets there or ends (then fails)
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        meanwhile()
        (holds / "locked.release").write_text("")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_an_output_that_appears_after_the_check_is_left_to_its_owner(run, tmp_path):
    """The command checked --out (absent), then took its lock: a directory or file a user put there in between, or
    while the run wrote, is theirs. Before: index build without --overwrite cleared the user's index-named files
    ("--overwrite left 1 entry", although no --overwrite was given), and an export replaced the user's file."""
    idx = tmp_path / "idx"

    def user_index_folder():
        idx.mkdir()
        (idx / "tokenizer.json").write_text("mine\n")
        (idx / "notes.txt").write_text("mine too\n")

    built = _held_at_locked(index_build(run, idx), tmp_path / "holds", user_index_folder)
    assert built.returncode == 2 and "appeared" in one_line(built.stderr) and "use --overwrite to replace it" in one_line(built.stderr), built.stderr
    assert sorted(p.name for p in idx.iterdir()) == ["notes.txt", "tokenizer.json"] and (idx / "tokenizer.json").read_text() == "mine\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".idx.")]  # its temporary build is gone

    pairs = tmp_path / "pairs.jsonl"
    exported = _held_at_locked(export_gmr(run, pairs), tmp_path / "holds2", lambda: pairs.write_text("user data\n"))
    assert exported.returncode == 2 and "was put there or changed while this run wrote it" in one_line(exported.stderr), exported.stderr
    assert pairs.read_text() == "user data\n" and not export_record(pairs).exists()


LOCKED = {
    "export gmr": lambda run, tmp: (export_gmr(run, tmp / "pairs.jsonl"), tmp / "pairs.jsonl"),
    "export sft": lambda run, tmp: (export_sft(run, tmp / "sft.json"), tmp / "sft.json"),
    "train sft": lambda run, tmp: (train_sft(run, tmp / "ckpt"), tmp / "ckpt"),
    "index build": lambda run, tmp: (index_build(run, tmp / "idx"), tmp / "idx"),
}


@pytest.mark.parametrize("command", sorted(LOCKED))
def test_a_second_writer_of_an_export_checkpoint_or_index_is_refused(run, tmp_path, command):
    """This test process holds the output's lock (as a running grtool would); the command exits 75 (try again
    later) naming it."""
    args, out = LOCKED[command](run, tmp_path)
    with output_lock(out, command=["grtool", "pretend", "run"]):
        err = refused(args, tmp_path, code=75, process=True)  # a lock is per process: the command needs one of its own

    assert f"pid {os.getpid()} on host" in err and "grtool pretend run" in err
    assert not out.exists() and not beside_lock(out).exists()


def test_a_training_run_killed_before_its_record_can_be_started_over(run, tmp_path):
    """A run records that it started (grtool-run.json) before the model loads: killed then, --overwrite accepts
    the directory; the refused base-model case above has no such record."""
    out = tmp_path / "ckpt"
    args = ["train", "sft", str(run["sft"]), "--out", str(out), "--max-steps", "1", "--cutoff-len", "256", "--per-device-batch-size", "2"]
    first = subprocess.Popen([sys.executable, "-m", "grtool", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (out / "grtool-run.json").is_file():  # a state: the run recorded its start
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
    finally:
        first.kill()
        first.communicate(timeout=60)
    (out / "checkpoint-1").mkdir(exist_ok=True)  # what a run killed after its first save holds besides
    assert "--overwrite" in one_line(run_cli(*args, check=2).stderr)  # still refused without it
    run_cli(*args, "--overwrite", "--dry-run")


# ------------------------------------------------- the seventh round: names, links, a stopped --overwrite


def test_overwrite_deletes_only_grtools_exact_names(run, tmp_path):
    # before: `part-*.parquet` and `fm_*` matched a user's part-of-my-thesis.parquet and fm_notes.txt, deleted
    stage, index = tmp_path / "out", tmp_path / "idx"
    run_cli(*filters_apply(run, stage))
    run_cli(*index_build(run, index))
    (stage / "part-of-my-thesis.parquet").write_text("mine\n")
    (index / "fm_notes.txt").write_text("mine\n")
    run_cli(*filters_apply(run, stage, "--overwrite"))
    run_cli(*index_build(run, index, "--overwrite"))
    assert (stage / "part-of-my-thesis.parquet").read_text() == "mine\n" and (index / "fm_notes.txt").read_text() == "mine\n"


def test_a_first_run_never_replaces_files_named_like_a_stages(run, tmp_path):
    # before: a user's _rejects/part-00000.jsonl (or part-00000.parquet) in the output was replaced, exit 0
    out = tmp_path / "out"
    (out / "_rejects").mkdir(parents=True)
    (out / "_rejects" / "part-00000.jsonl").write_text("precious\n")
    err = refused(filters_apply(run, out), out / "_rejects" / "part-00000.jsonl")
    assert "holds _rejects/part-00000.jsonl but no _manifest.json, so grtool did not write them" in err, err


def test_a_stopped_overwrite_is_finished_by_the_next_overwrite_never_resumed(run, tmp_path):
    """A stage whose --overwrite was stopped after it deleted the manifest (the marker is there, the old parts
    too): before, a plain rerun adopted the old parts under the new parameters (exit 0), and --overwrite refused
    the directory as one grtool did not write."""
    from grtool.store.outputs import CLEARING

    out = tmp_path / "out"
    run_cli(*filters_apply(run, out))
    (out / CLEARING).write_text("{}")  # where a clear stands once it deleted the manifest
    (out / "_manifest.json").unlink()
    err = refused(filters_apply(run, out, "--max-docids", "1"), out)
    assert "an --overwrite of it was stopped before it finished deleting; run with --overwrite again" in err, err
    run_cli(*filters_apply(run, out, "--max-docids", "1", "--overwrite"))
    assert not (out / CLEARING).exists()
    run_cli("validate", out)


def test_an_index_out_that_is_a_symbolic_link_is_refused_before_any_work(run, tmp_path):
    # before: --overwrite through the link emptied the index it points to, then failed ("not a directory")
    index, link = tmp_path / "idx", tmp_path / "link"
    run_cli(*index_build(run, index))
    link.symlink_to(index)
    for extra in (("--overwrite",), ("--kind", "trie")):  # another build without --overwrite too: said before "use --overwrite"
        err = refused(index_build(run, link, *extra), index)
        assert "is a symbolic link" in err and "name the directory itself" in err and "use --overwrite" not in err, err
    run_cli(*index_build(run, link))  # the same build behind the link: kept, nothing to do


def test_the_lock_beside_an_output_is_one_for_every_spelling_of_its_path(tmp_path):
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "link").symlink_to(tmp_path / "a" / "sub")
    # `b/link/../idx` is a/idx: the lexical spelling b/idx would have let two builds into one directory
    assert beside_lock(tmp_path / "b" / "link" / ".." / "idx") == beside_lock(tmp_path / "a" / "idx")


@pytest.mark.parametrize("args", [("corpus", "stats", "{root}", "--plot", "-"), ("corpus", "overlap", "{root}", "--plot", "-")])
def test_a_file_option_given_dash_is_refused_not_silently_nothing(run, args):
    # before: exit 0 and no chart anywhere
    err = refused(tuple(str(a).replace("{root}", str(run["root"])) for a in args), run["root"])
    assert "--plot -: --plot writes a file, not standard output" in err, err


def test_an_index_overwrite_stopped_before_the_new_index_was_in_place_is_finished_by_the_next(run, tmp_path):
    """The old index deleted, the new one not yet moved in (a stop between): before, --overwrite refused the
    directory as one grtool did not write (its notes.txt and no index.json), and the user was stuck."""
    from grtool.store.outputs import CLEARING

    index = tmp_path / "idx"
    run_cli(*index_build(run, index))
    (index / "notes.txt").write_text("keep me\n")
    for entry in index.iterdir():
        if entry.name != "notes.txt":
            entry.unlink()
    (index / CLEARING).write_text("{}")
    run_cli(*index_build(run, index, "--overwrite"))
    assert (index / "notes.txt").read_text() == "keep me\n" and not (index / CLEARING).exists()
    run_cli("index", "stats", index)


def test_overwrite_of_an_index_whose_record_repeats_a_key_names_the_damage(run, tmp_path):
    index = tmp_path / "idx"
    run_cli(*index_build(run, index))
    record = index / "index.json"
    record.write_text(record.read_text().replace("{", '{"format": "grtool-index/1", ', 1))
    err = refused(index_build(run, index, "--overwrite"), index)
    assert "its index.json is damaged" in err and "field format is given twice" in err and "None" not in err, err


def test_overwrite_of_a_stage_whose_manifest_repeats_a_key_names_the_damage(run, tmp_path):
    """A damaged manifest cannot say which table the stage holds: refused, naming the damage (not "table None")."""
    other = tmp_path / "chains-copy"
    shutil.copytree(run["root"] / "triples", other)
    manifest = other / "_manifest.json"
    manifest.write_text(manifest.read_text().replace("{", '{"table": "chains", ', 1))
    make, _ = UNKNOWN["filters apply"]
    err = refused(make(run, other, "--overwrite"), other)
    assert "its _manifest.json is damaged" in err and "field table is given twice" in err and "None" not in err
