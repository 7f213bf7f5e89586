"""Issue 25, adversarial pass: a hostile user's outputs, damaged records and pipeline files.

Real CLI runs in subprocesses on a real ingest of the repository's small examples. Every refusal is exit 2
(or 1 for damaged data), one line, and leaves every file as it was.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from conftest import run_cli

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"
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


INDEX_TRIPLES = Path(__file__).resolve().parent / "data" / "index_triples.jsonl"


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adv-index") / "idx"
    run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", out, input=INDEX_TRIPLES.read_text())
    return out


def _edited_index(index_dir: Path, target: Path, edit) -> Path:
    import json

    shutil.copytree(index_dir, target)
    meta = json.loads((target / "index.json").read_text())
    new = edit(meta)
    (target / "index.json").write_bytes(new if isinstance(new, bytes) else json.dumps(meta if new is None else new).encode())
    return target


EDITS = {
    "list": lambda m: [m], "string": lambda m: "index", "not-utf8": lambda m: b"\xff\xfe{",
    "files-a-list": lambda m: m.update(files=[1, 2], sizes=3, inputs=[5]),
    "bad-entries": lambda m: m["files"].update({"x": 5, "../../index.json": {"bytes": 1}}),
    "inputs-a-string": lambda m: m.update(inputs="abc"),
}  # fmt: skip


def test_an_edited_index_json_is_one_line_never_a_traceback(index_dir, tmp_path):
    """index.json that is JSON but not an object, not UTF-8, or with entries of the wrong type: `index query` and
    `validate` crashed with AttributeError tracebacks; `index build --overwrite` (own_entries) too for files=[...]."""
    for name, edit in EDITS.items():
        idx = _edited_index(index_dir, tmp_path / "all" / name, edit)
        q = run_cli("index", "query", idx, "--ids", "1", check=False)
        assert q.returncode in (1, 2) and "Traceback" not in q.stderr, (name, q.stderr)  # 1: a damaged record
        v = run_cli("validate", idx, check=1)
        assert "Traceback" not in v.stderr and "FAIL" in v.stdout + v.stderr, (name, v.stderr)
    idx = tmp_path / "all" / "files-a-list"
    run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", idx, "--overwrite",
            input=INDEX_TRIPLES.read_text())
    run_cli("validate", idx)


RECORD_EDITS = {
    "manifest-list": ("documents/_manifest.json", b"[]"),
    "manifest-bad-table": ("documents/_manifest.json", lambda m: m.update(table=["x"])),
    "manifest-not-json": ("documents/_manifest.json", b"{bad"),
    "shard-record-list": ("documents/_shards/part-00000.json", b"[1]"),
    "shard-record-types": ("documents/_shards/part-00000.json", lambda r: r.update(rows="x", bytes=None)),
}  # fmt: skip


@pytest.mark.parametrize("name", RECORD_EDITS)
def test_an_edited_stage_record_is_one_line_and_never_a_silent_pass(corpus, tmp_path, name):
    """A manifest or shard record that is JSON of the wrong shape crashed `corpus stats`, `corpus merge` and
    `validate` with AttributeError/TypeError tracebacks (a shard record with a string `rows` was even read by
    stats), and `validate RUN/questions` passed with its gold check silently skipped when the sibling
    documents' manifest could not be read."""
    import json

    c = tmp_path / "c"
    shutil.copytree(corpus, c)
    rel, edit = RECORD_EDITS[name]
    f = c / rel
    if callable(edit):
        data = json.loads(f.read_text())
        edit(data)
        edit = json.dumps(data).encode()
    f.write_bytes(edit)
    for args in (("corpus", "stats", c), ("corpus", "merge", c, "--out", tmp_path / "m")):
        proc = run_cli(*args, check=1)  # a damaged record (DESIGN §8)
        assert "Traceback" not in proc.stderr and str(f) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run_cli("validate", c, check=1).stderr
    alone = run_cli("validate", c / "questions", check=1 if "manifest" in name else False)
    assert "Traceback" not in alone.stderr
    if "manifest" in name:
        assert "gold doc ids not checked" in alone.stdout + alone.stderr


def test_a_pipeline_report_never_replaces_an_input(tmp_path):
    """A stage's `stdout` (or --summary-json) naming a file the pipeline reads replaced the user's raw data with a
    JSON report: `stats` wrote its --json over the ingest input. Refused before any stage runs; reading an
    earlier stage's report stays fine."""
    raw = tmp_path / "in.jsonl"
    shutil.copy(MUSIQUE, raw)
    toml = tmp_path / "p.toml"
    toml.write_text(f'''out = "{tmp_path / 'o'}"
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
    before = raw.read_bytes()
    for extra in (("--set", f"stats.stdout={raw}"), ("--json", raw), ("--summary-json", raw)):
        for dry in ((), ("--dry-run",)):
            proc = run_cli("pipeline", "run", toml, *extra, *dry, check=2)
            assert "is the input" in proc.stderr and not (tmp_path / "o").exists()
    assert raw.read_bytes() == before


def test_index_build_out_dash_is_refused_not_a_directory_named_dash(tmp_path):
    """`--out -` means standard output everywhere; `index build --out -` built an index in a directory `./-`."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "grtool", "index", "build", "-", "--tokenizer", "llama3", "--out", "-"],
                          input=INDEX_TRIPLES.read_text(), capture_output=True, text=True, cwd=tmp_path, env=os.environ)  # fmt: skip
    assert proc.returncode == 2 and "standard output" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting", ["ingest.overwrite=no", "ingest.strict='false'", "stats.json=1", "ingest.args='unclosed"])
def test_pipeline_set_values_that_cannot_mean_what_they_say_are_refused(tmp_path, setting):
    """`overwrite = "no"` (a string for a flag) became `--overwrite no`: overwrite ON and `no` read as an input;
    an unclosed quote in `--set stage.args=...` was a ValueError traceback. Both refused in one line, exit 2."""
    toml = tmp_path / "p.toml"
    toml.write_text(f'''out = "{tmp_path / 'o'}"
[[stages]]
name = "ingest"
run = "corpus ingest"
args = ["{MUSIQUE}"]
options = {{ out = "{{out}}/c" }}
[[stages]]
name = "stats"
run = "corpus stats"
args = ["{{out}}/c"]
options = {{ json = true }}
stdout = "{{out}}/stats.json"
''')
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
                   input=INDEX_TRIPLES.read_text(), check=2)  # fmt: skip
    assert "not one grtool wrote" in proc.stderr
    assert snapshot(user) == before


def test_an_out_that_is_a_dangling_symlink_is_refused_before_the_build(tmp_path):
    """`index build --out LINK` with LINK pointing nowhere built the whole index and then died with a
    NotADirectoryError traceback when moving it in place."""
    link = tmp_path / "idx"
    link.symlink_to(tmp_path / "missing" / "idx")
    proc = run_cli("index", "build", "-", "--tokenizer", "llama3", "--kind", "numpy", "--out", link,
                   input=INDEX_TRIPLES.read_text(), check=2)  # fmt: skip
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
