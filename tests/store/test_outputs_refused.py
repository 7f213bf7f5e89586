"""Outputs a command must refuse (issue #25): into its own input, over another table, a pipeline report onto an
input, `--out -` where a directory is meant, a dangling symlink, an empty pipeline `out`, `--set` values that
cannot mean what they say.

Real CLI runs in subprocesses on a real ingest of the repository's small examples. Every refusal is exit 2
(or 1 for damaged data), one line, and leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from conftest import EXAMPLES, run_cli
from index_helpers import BUNDLED

MUSIQUE = EXAMPLES / "musique" / "musique_ans_v1.0_dev.example.jsonl"


def snapshot(root: Path) -> dict[str, str]:
    """Every file below ``root`` with its sha256, and every directory: equal snapshots = nothing touched."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A run directory with documents/ and questions/ ingested from the bundled MuSiQue example."""
    root = tmp_path_factory.mktemp("adv") / "corpus"
    run_cli("corpus", "ingest", MUSIQUE, "--out", root)
    return root


def test_merge_into_its_input_leaves_no_spill_inside_it(corpus, tmp_path):
    """`corpus merge C --out C/documents` was refused only after phase 1 had spilled into
    C/documents/_merge_work, which stayed there: inside the input stage."""
    c = tmp_path / "c"
    shutil.copytree(corpus, c)
    before = snapshot(c)
    for out in (c, c / "documents"):
        proc = run_cli("corpus", "merge", c, "--out", out, "--overwrite", check=2)
        assert "the input" in proc.stderr and "Traceback" not in proc.stderr
        assert snapshot(c) == before


def test_overwrite_refused_for_one_table_replaces_neither(corpus, tmp_path):
    """`--out X --overwrite` where X/documents is grtool's and X/questions a user's folder: the documents were
    cleared and rewritten before questions were refused. Both are checked before anything is written."""
    x = tmp_path / "x"
    shutil.copytree(corpus / "documents", x / "documents")
    (x / "questions").mkdir()
    (x / "questions" / "notes.txt").write_text("mine\n")
    before = snapshot(x)
    for command in (("corpus", "merge", corpus), ("corpus", "ingest", MUSIQUE)):
        proc = run_cli(*command, "--out", x, "--overwrite", check=2)
        assert "notes.txt" in proc.stderr and "no _manifest.json" in proc.stderr
        assert snapshot(x) == before


def _ingest_then_stats(tmp_path: Path, raw: Path) -> Path:
    """A pipeline file of two stages: ``corpus ingest RAW`` into {out}/c, then its stats as {out}/stats.json."""
    toml = tmp_path / "p.toml"
    toml.write_text(f'''out = "{tmp_path / "o"}"
[[stages]]
name = "ingest"
run = "corpus ingest"
args = ["{raw}"]
options = {{ out = "{{out}}/c" }}
[[stages]]
name = "stats"
run = "corpus stats"
args = ["{{out}}/c"]
options = {{ json = true }}
stdout = "{{out}}/stats.json"
''')
    return toml


def test_a_pipeline_report_never_replaces_an_input(tmp_path):
    """A stage's `stdout` (or --summary-json) naming a file the pipeline reads replaced the user's raw data with a
    JSON report: `stats` wrote its --json over the ingest input. Refused before any stage runs; reading an
    earlier stage's report stays fine."""
    raw = tmp_path / "in.jsonl"
    shutil.copy(MUSIQUE, raw)
    toml = _ingest_then_stats(tmp_path, raw)
    before = raw.read_bytes()
    for extra in (("--set", f"stats.stdout={raw}"), ("--json", raw), ("--summary-json", raw)):
        for dry in ((), ("--dry-run",)):
            proc = run_cli("pipeline", "run", toml, *extra, *dry, check=2)
            said = "is the input" if extra[0] == "--set" else "grtool did not write it"  # --json: the file's claim says it first
            assert said in proc.stderr and not (tmp_path / "o").exists()
    assert raw.read_bytes() == before


def test_index_build_out_dash_is_refused_not_a_directory_named_dash(tmp_path):
    """`--out -` means standard output everywhere; `index build --out -` built an index in a directory `./-`."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "grtool", "index", "build", "-", "--tokenizer", "llama3", "--out", "-"],
                          input=BUNDLED.read_text(), capture_output=True, text=True, cwd=tmp_path, env=os.environ)  # fmt: skip
    assert proc.returncode == 2 and "standard output" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting", ["ingest.overwrite=no", "ingest.strict='false'", "stats.json=1", "ingest.args='unclosed"])
def test_pipeline_set_values_that_cannot_mean_what_they_say_are_refused(tmp_path, setting):
    """`overwrite = "no"` (a string for a flag) became `--overwrite no`: overwrite ON and `no` read as an input;
    an unclosed quote in `--set stage.args=...` was a ValueError traceback. Both refused in one line, exit 2."""
    toml = _ingest_then_stats(tmp_path, MUSIQUE)
    proc = run_cli("pipeline", "run", toml, "--set", setting, "--dry-run", check=2)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "o").exists()


def test_index_overwrite_refuses_an_index_json_grtool_did_not_write(tmp_path):
    """`index.json` is a common file name: any such file counted as grtool's record, so `index build --overwrite`
    into a user's folder holding one deleted that index.json and every file with an index file's name
    (tokenizer.json, doc_ids.txt, ...). Only an index.json of grtool's format is its record."""
    user = tmp_path / "webapp"
    user.mkdir()
    (user / "index.json").write_text('{"name": "my web app", "files": {"app.js": {}}}')
    (user / "tokenizer.json").write_text('{"mine": true}')
    (user / "app.js").write_text("console.log(1)\n")
    before = snapshot(user)
    proc = run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", user, "--overwrite",
                   input=BUNDLED.read_text(), check=2)  # fmt: skip
    assert "not one grtool wrote" in proc.stderr
    assert snapshot(user) == before


def test_an_out_that_is_a_dangling_symlink_is_refused_before_the_build(tmp_path):
    """`index build --out LINK` with LINK pointing nowhere built the whole index and then died with a
    NotADirectoryError traceback when moving it in place."""
    link = tmp_path / "idx"
    link.symlink_to(tmp_path / "missing" / "idx")
    proc = run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", link,
                   input=BUNDLED.read_text(), check=2)  # fmt: skip
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"] and link.is_symlink()


def test_a_pipeline_with_an_empty_out_is_refused_not_written_at_the_root(tmp_path):
    """`out = ""` made every "{out}/corpus" the absolute path "/corpus": the stages wrote at the file system root."""
    toml = tmp_path / "p.toml"
    toml.write_text(f'out = ""\n[[stages]]\nname = "ingest"\nrun = "corpus ingest"\nargs = ["{MUSIQUE}"]\n'
                    'options = { out = "{out}/grtool-adversarial-test" }\n')  # fmt: skip
    proc = run_cli("pipeline", "run", toml, "--dry-run", check=2)
    assert "out is empty" in proc.stderr
    assert not Path("/grtool-adversarial-test").exists()
