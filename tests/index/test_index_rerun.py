"""`index build` run again: the same input, tokenizer and options keep the index ("up to date", exit 0, nothing
read or tokenized); anything else is refused naming what differs, until --overwrite. In `pipeline run`, a stage
named with --overwrite STAGE replaces its output, and --overwrite is never part of the command a stage records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import subprocess
from index_helpers import BUNDLED
from strict_cli_helpers import grtool as strict_grtool

ROWS = [json.loads(line) for line in BUNDLED.read_text().splitlines()]


def write_triples(path: Path, rows: list[dict]) -> Path:
    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter

    stage = StageWriter(path, StageSpec("triples", TRIPLES), overwrite=True)
    with stage.shard(0) as sh:
        sh.count_in(len(rows))
        sh.write_rows(rows)
    stage.finish()
    return path


def write_tokenizer(path: Path, words: int = 20, indent: int | None = None) -> Path:
    """A small word-level tokenizer.json (loading it takes milliseconds, unlike a 128K vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(words)} | {"[UNK]": words}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    text = json.loads(tok.to_str())
    path.write_text(json.dumps(text, indent=indent))
    return path


def grtool(words: list, monkeypatch, capsys) -> tuple[int, str, str]:
    """The `grtool` entry point (grtool.cli.main.run) in this process: (exit code, stdout, stderr on one line)."""
    from grtool.cli.main import run

    monkeypatch.setattr(sys, "argv", ["grtool", *map(str, words)])
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as e:
        run(ends_process=False)
    captured = capsys.readouterr()
    return e.value.code or 0, captured.out, " ".join(captured.err.split())


def mtimes(path: Path) -> dict[str, int]:
    return {f.name: f.stat().st_mtime_ns for f in sorted(path.iterdir())}


def test_an_identical_rerun_is_up_to_date_in_milliseconds(tmp_path, monkeypatch, capsys):
    from grtool.index.build import build_index

    stage = write_triples(tmp_path / "triples", ROWS)
    out = tmp_path / "idx"
    build = ["index", "build", stage, "--tokenizer", "llama3", "--kind", "fm", "--out", out]
    code, _, err = grtool(build, monkeypatch, capsys)
    assert code == 0 and "built" in err
    before = mtimes(out)
    # the same command again: kept, exit 0, the files untouched
    code, _, err = grtool(build, monkeypatch, capsys)
    assert code == 0 and "up to date" in err and mtimes(out) == before
    code, stdout, _ = grtool([*build, "--json", "--memory-limit", "1G"], monkeypatch, capsys)  # the limit shapes a build, not the index
    assert code == 0 and json.loads(stdout)["up_to_date"] is True and mtimes(out) == before
    import grtool.index.build as build_module

    def not_loaded(*args, **kwargs):  # (held by what it calls, not by a clock: a busy machine's second is no proof)
        raise AssertionError("an up-to-date index loaded its tokenizer")

    monkeypatch.setattr(build_module, "load_tokenizer", not_loaded)
    meta = build_index(stage, out, tokenizer="llama3", kind="fm")  # no tokenizer loaded (seconds for llama3), nothing read
    assert meta["up_to_date"] is True
    # another option or another input: refused, naming it; the index stays
    code, _, err = grtool([*build[:-4], "--kind", "trie", "--out", out], monkeypatch, capsys)
    assert code == 2 and "--kind ('fm' before, 'trie' now)" in err and "--overwrite" in err
    code, _, err = grtool([*build, "--sample-rate", "4"], monkeypatch, capsys)
    assert code == 2 and "--sample-rate (32 before, 4 now)" in err
    write_triples(stage, ROWS[:-2])
    code, _, err = grtool(build, monkeypatch, capsys)
    assert code == 2 and f"input ({stage}: path or contents changed)" in err
    assert mtimes(out) == before


def test_the_tokenizer_is_compared_by_its_file_then_by_its_content(tmp_path, monkeypatch, capsys):
    stage = write_triples(tmp_path / "triples", ROWS)
    tok = write_tokenizer(tmp_path / "tok.json")
    out = tmp_path / "idx"
    build = ["index", "build", stage, "--tokenizer", tok, "--kind", "numpy", "--out", out]
    assert grtool(build, monkeypatch, capsys)[0] == 0
    before = mtimes(out)
    write_tokenizer(tok, indent=2)  # the file changed, the tokenizer did not: loaded and compared, still up to date
    code, _, err = grtool(build, monkeypatch, capsys)
    assert code == 0 and "up to date" in err and mtimes(out) == before
    write_tokenizer(tok, words=30)  # another vocabulary
    code, _, err = grtool(build, monkeypatch, capsys)
    assert code == 2 and "--tokenizer" in err and "another vocabulary" in err
    code, _, err = grtool([*build, "--overwrite"], monkeypatch, capsys)
    assert code == 0 and "built" in err and mtimes(out) != before


def test_pipeline_overwrite_stage_replaces_a_changed_stage_and_is_never_recorded(tmp_path, monkeypatch, capsys, write_pipeline):
    stage = write_triples(tmp_path / "triples", ROWS)
    tok = write_tokenizer(tmp_path / "tok.json")
    config = write_pipeline([{"name": "index", "run": "index build", "args": [stage], "options": {"tokenizer": tok, "kind": "numpy", "out": "{out}/index"}}], out=tmp_path / "out")
    index = tmp_path / "out" / "index"

    def kind() -> str:
        return json.loads((index / "index.json").read_text())["kind"]

    def pipeline(*extra: str) -> tuple[int, str]:
        code, _, err = grtool(["pipeline", "run", config, *extra], monkeypatch, capsys)
        return code, err

    assert pipeline()[0] == 0 and kind() == "numpy"
    code, err = pipeline()
    assert code == 0 and "stage index: done, skipped" in err
    # a changed option: the index there was built otherwise, so the stage is refused and says how to go on
    code, err = pipeline("--set", "index.kind=trie")
    assert code == 2 and "--kind ('numpy' before, 'trie' now)" in err and "--overwrite index" in err and kind() == "numpy"
    code, err = pipeline("--set", "index.kind=trie", "--overwrite", "index")
    assert code == 0 and "--out " + str(index) + " --overwrite" in err and kind() == "trie"
    code, err = pipeline("--set", "index.kind=trie")
    assert code == 0 and "stage index: done, skipped" in err
    # overwrite = true as a stage option runs it with --overwrite; the next plain run finds it done
    assert pipeline("--set", "index.overwrite=true")[0] == 0 and kind() == "numpy"
    record = json.loads((tmp_path / "out" / "_pipeline" / "index.json").read_text())
    assert "--overwrite" not in record["command"]
    code, err = pipeline()
    assert code == 0 and "stage index: done, skipped" in err
    # a changed input is remade with --overwrite without being asked
    write_triples(stage, ROWS[:-2])
    code, err = pipeline()
    assert code == 0 and "changed since it ran" in err and json.loads((index / "index.json").read_text())["sizes"]["sequences"] < 9
    # --overwrite names a stage of the file
    code, err = pipeline("--overwrite", "indx")
    assert code == 2 and "no stage named 'indx'" in err


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_killed_index_builds_temporary_directory_is_named_by_validate_and_removed_by_the_next_build(tmp_path):
    """`index build` writes into .<out>.<pid>.tmp beside --out; SIGKILL leaves it (with its scratch files)."""
    import json

    from index_helpers import write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(tmp_path / "triples", rows)
    build = ("index", "build", tmp_path / "triples", "-t", "llama3", "--out", tmp_path / "idx")
    assert strict_grtool(*build).returncode == 0
    left = tmp_path / f".idx.{_dead_pid()}.tmp"
    left.mkdir()
    (left / ".scratch-tokens.u32").write_bytes(b"\0" * 64)
    proc = strict_grtool("validate", tmp_path / "idx")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert f"left by a killed `index build` beside it: {left.name}" in proc.stderr.decode() + proc.stdout.decode()
    assert strict_grtool(*build, "--overwrite").returncode == 0
    assert not left.exists()
    again = tmp_path / f".idx.{_dead_pid()}.tmp"
    again.mkdir()
    assert strict_grtool(*build).returncode == 0  # up to date: kept as it is, and what a killed build left goes too
    assert not again.exists()  # before: left, though validate said the next build removes it
    proc = strict_grtool("validate", tmp_path / "idx")
    assert proc.returncode == 0 and left.name not in proc.stderr.decode() + proc.stdout.decode()
