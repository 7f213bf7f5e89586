"""Issue 36 §3: the outputs of one command never meet each other, and --overwrite deletes only grtool's files.

Every output a command writes (its stage, --report, --plot, a --json file, standard output redirected to a file)
is checked against every other output and every input before anything is written: equal (symlinks resolved) or
one inside the other is exit 2 with one line, and nothing changes. --overwrite removes regular files and symbolic
links named like grtool's own files; a directory (or a FIFO) with such a name is refused, and nothing is deleted.
Real CLI runs in subprocesses on the samples corpus (the `samples` fixture, tests/sample_helpers.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli, write_pipeline_file
from sample_helpers import write_chains
from output_helpers import one_line, snapshot


@pytest.fixture(scope="module")
def run(samples, tmp_path_factory) -> dict:
    """The sample run directory, a chains stage, and one filtered stage f6 made by a real `filters apply`."""
    base = tmp_path_factory.mktemp("collide")
    write_chains(samples, base / "chains")
    info = {"base": base, "root": samples["root"], "chains": base / "chains"}
    run_cli(*filters_apply(info, base / "f6"))
    return {**info, "f6": base / "f6"}


def filters_apply(run: dict, out: Path, *extra) -> tuple:
    # --allow-empty: the sample chains do not pass every rule; what is tested is where the outputs go
    return ("filters", "apply", run["chains"], "--corpus", run["root"], "--triples", run["root"], "--out", out, "--allow-empty", *extra)


def refused(args: tuple, *watched: Path, stdout=None) -> str:
    """Exit 2, one `error:` line, no traceback, every watched path as it was. Returns stderr on one line."""
    before = [snapshot(w) if w.exists() else None for w in watched]
    cmd = [sys.executable, "-m", "grtool", *map(str, args)]
    proc = subprocess.run(cmd, stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = one_line(proc.stderr)
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert [snapshot(w) if w.exists() else None for w in watched] == before
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, proc.stderr
    return err


def readable(stage: Path) -> None:
    """The stage still opens (validate exit 0)."""
    run_cli("validate", stage)


# ------------------------------------------------------------------------------ outputs of one command


@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["resume", "overwrite"])
def test_the_issue_report_over_its_own_stage_manifest_is_refused(run, overwrite):
    """`--out f6 --report f6/_manifest.json` wrote the report over the stage's manifest and exited 0."""
    f6 = run["f6"]
    err = refused(filters_apply(run, f6, "--report", f6 / "_manifest.json", *overwrite), f6)
    assert f"--report {f6 / '_manifest.json'}: lies inside --out {f6}" in err
    readable(f6)


def test_the_issue_report_equal_to_the_new_stage_is_refused_before_anything_exists(run):
    """`--report f5 --out f5` wrote the stage, then a traceback."""
    f5 = run["base"] / "f5"
    err = refused(filters_apply(run, f5, "--report", f5))
    assert f"--out {f5}: is also --report {f5}" in err
    assert not f5.exists()


def test_a_report_through_a_symlink_into_the_stage_is_refused(run, tmp_path):
    link = tmp_path / "report.md"
    link.symlink_to(run["f6"] / "part-00000.parquet")
    err = refused(filters_apply(run, run["f6"], "--report", link), run["f6"])
    assert f"--report {link}: lies inside --out {run['f6']}" in err


def test_a_stage_written_inside_the_report_path_is_refused(run, tmp_path):
    """The other way round: the stage would go inside a path the report is written to."""
    out = tmp_path / "r" / "stage"
    err = refused(filters_apply(run, out, "--report", tmp_path / "r"))
    assert f"--out {out}: lies inside --report {tmp_path / 'r'}" in err
    assert not (tmp_path / "r").exists()


def test_a_report_inside_an_input_stage_is_refused(run):
    target = run["chains"] / "report.md"
    err = refused(filters_apply(run, run["base"] / "f7", "--report", target), run["chains"])
    assert f"--report {target}: lies inside the input {run['chains']}" in err


def test_stdout_redirected_into_the_stage_is_refused(run):
    """`... --out f6 --json > f6/_manifest.json`: the shell opened the file; grtool must not write both."""
    f6 = run["f6"]
    manifest = f6 / "_manifest.json"
    before = manifest.read_bytes()
    with open(manifest, "a") as redirected:  # appending: the shell's `>>`, which leaves the bytes as they are
        err = refused(filters_apply(run, f6, "--json"), stdout=redirected)
    assert f"stdout {manifest}: lies inside --out {f6}" in err
    assert manifest.read_bytes() == before
    readable(f6)


def test_stdout_redirected_to_an_exported_file_is_refused(run, tmp_path):
    out = tmp_path / "sft.json"
    with open(out, "w") as redirected:
        err = refused(("export", "sft", run["f6"], "--corpus", run["root"], "--out", out, "--json"), stdout=redirected)
    assert f"is also stdout {out}" in err or f"stdout {out}: is also --out {out}" in err


def test_eval_compare_plot_equal_to_out_is_refused(run, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "recall.md"
    err = refused(("eval", "compare", f"a={tmp_path / 'a.json'}", "--out", target, "--plot", target))
    assert f"--out {target}: is also --plot {target}" in err
    assert not target.exists()


def test_a_plot_inside_an_input_stage_is_refused(run):
    pytest.importorskip("matplotlib")
    target = run["root"] / "questions" / "stats.png"
    err = refused(("corpus", "stats", run["root"], "--plot", target), run["root"] / "questions")
    assert f"--plot {target}: lies inside {run['root'] / 'questions'}, a stage directory grtool wrote" in err


def test_a_plot_beside_the_stages_of_its_run_directory_is_fine(run, tmp_path):
    """The documented example (`--plot out/corpus/stats.png`): a run directory holds stages and reports."""
    pytest.importorskip("matplotlib")
    target = run["root"] / "stats.png"
    run_cli("corpus", "stats", run["root"], "--plot", target)
    assert target.is_file()
    target.unlink()


def test_pipeline_json_inside_a_stage_output_is_refused(tmp_path, examples):
    out = tmp_path / "run"
    config = write_pipeline_file(tmp_path / "p.toml", [
        {"name": "ingest", "run": "corpus ingest", "args": [examples / "generic" / "questions_dev.jsonl", examples / "generic" / "documents.jsonl"],
         "options": {"dataset": "generic", "out": out / "corpus"}},
    ], out=out)  # fmt: skip
    target = out / "corpus" / "questions" / "_manifest.json"
    err = refused(("pipeline", "run", config, "--json", target))
    assert f"--json {target}: _manifest.json is the name of the record grtool keeps of an output" in err
    assert not out.exists() or not (out / "corpus").exists()


@pytest.mark.parametrize("where", ["equal", "containing"])
def test_a_request_cache_equal_to_or_holding_the_output_is_refused(run, tmp_path, where):
    out = tmp_path / "t" / "out"
    cache = out if where == "equal" else tmp_path / "t"
    args = ("triples", "extract", run["root"] / "documents", "--out", out, "--cache-dir", cache, "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m")
    err = refused(args)
    said = f"--out {out}: is also --cache-dir {cache}" if where == "equal" else f"--out {out}: lies inside --cache-dir {cache}"
    assert said in err
    assert not (tmp_path / "t").exists()


# ------------------------------------------------------------------------------ --overwrite deletes files only


def copy_of(run: dict, tmp_path: Path) -> Path:
    stage = tmp_path / "f6"
    shutil.copytree(run["f6"], stage, symlinks=True)
    return stage


def test_the_issue_a_directory_named_like_a_part_is_refused_and_kept(run, tmp_path):
    """A directory `part-00000.parquet` holding a user's file was deleted with exit 0."""
    stage = copy_of(run, tmp_path)
    first = sorted(stage.glob("part-*.parquet"))[0]
    first.unlink()
    first.mkdir()
    (first / "mine.txt").write_text("the user's\n")
    err = refused(filters_apply(run, stage, "--overwrite"), stage)
    assert f"{first}" in err and "directory" in err
    assert (first / "mine.txt").read_text() == "the user's\n"


def test_a_fifo_named_like_grtool_s_manifest_tmp_is_refused(run, tmp_path):
    stage = copy_of(run, tmp_path)
    fifo = stage / "_manifest.json.123.tmp"
    os.mkfifo(fifo)
    err = refused(filters_apply(run, stage, "--overwrite"), stage)
    assert f"{fifo}" in err
    assert fifo.exists()


def test_a_directory_named_like_grtool_s_rejects_file_is_refused(run, tmp_path):
    stage = copy_of(run, tmp_path)
    rejects = stage / "_rejects"
    if not rejects.is_dir():
        rejects.mkdir()
    odd = rejects / "part-00000.jsonl"
    if odd.exists():
        odd.unlink()
    odd.mkdir()
    (odd / "keep.txt").write_text("x")
    err = refused(filters_apply(run, stage, "--overwrite"), stage)
    assert f"{odd}" in err
    assert (odd / "keep.txt").exists()


def test_a_symlink_named_like_a_part_is_removed_not_followed(run, tmp_path):
    stage = copy_of(run, tmp_path)
    precious = tmp_path / "precious.parquet"
    precious.write_bytes(b"the user's bytes")
    first = sorted(stage.glob("part-*.parquet"))[0]
    first.unlink()
    first.symlink_to(precious)
    run_cli(*filters_apply(run, stage, "--overwrite"))
    assert precious.read_bytes() == b"the user's bytes"
    readable(stage)
