"""Damaged inputs and full disks: one `error:` line naming the file, exit 1, never a traceback (issue #25, 6/9/15).

The stages are real: `corpus ingest` of the bundled examples, plus triples and chains stages written with the
stage writer. Each test copies them, damages one shard the way disks and people do (bytes overwritten in the
middle, cut short, emptied, deleted, or damaged before its completion record was written, so that only the
Parquet reader can tell) and runs the real command in a subprocess.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import EXAMPLES
from log_helpers import unstamped
from grtool.store.stage import read_table
from run_helpers import write_small_run

HINT = "run grtool validate"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A corpus run directory (documents, questions), its triples and chains, and responses to score."""
    root = tmp_path_factory.mktemp("pristine") / "run"
    write_small_run(root, root.parent / "responses.jsonl")
    return root


@pytest.fixture
def run(pristine, tmp_path) -> Path:
    root = tmp_path / "run"
    shutil.copytree(pristine, root)
    shutil.copy(pristine.parent / "responses.jsonl", tmp_path / "responses.jsonl")
    return root


def damage(shard: Path, kind: str, column: str | None = None) -> None:
    """Damage a committed shard. ``*-recorded``: the damage happened before the completion record was written
    (the record holds the damaged file's size and sha256), so only reading the Parquet file can find it.
    ``page``: the header of ``column``'s first data page is overwritten; the footer still reads, the error
    comes only when that page is decoded (lazily, while batches are read)."""
    import pyarrow.parquet as pq

    data = bytearray(shard.read_bytes())
    n = len(data)
    base = kind.removesuffix("-recorded")
    if base == "middle":  # bytes overwritten inside the data pages
        data[n // 2 : n // 2 + 64] = b"\xff" * 64
    elif base == "truncated":
        data = data[: n // 2]
    elif base == "empty":
        data = bytearray()
    elif base == "magic":  # "PAR1" at both ends (readers check the one after the footer)
        data[:4] = data[-4:] = b"XXXX"
    elif base == "footer":  # the footer length points before the file's start
        data[-8:-4] = (n * 2).to_bytes(4, "little")
    elif base == "page":
        meta = pq.ParquetFile(shard).metadata.row_group(0)
        chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        data[start : start + 16] = b"\xff" * 16
    elif base == "missing":
        shard.unlink()
        return
    elif base == "gone":  # the file and its record, still listed in the manifest
        shard.unlink()
        (shard.parent / "_shards" / f"{shard.stem}.json").unlink()
        return
    shard.write_bytes(bytes(data))
    if kind.endswith("-recorded"):
        record_path = shard.parent / "_shards" / f"{shard.stem}.json"
        record = json.loads(record_path.read_text())
        record.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        record_path.write_text(json.dumps(record))
        manifest_path = shard.parent / "_manifest.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["shards"][shard.stem].update(bytes=len(data), sha256=record["sha256"])
        manifest_path.write_text(json.dumps(manifest))


def assert_named(proc: subprocess.CompletedProcess, shard: Path) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in unstamped(proc.stderr) if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    text = flat(proc.stderr[proc.stderr.index("error:") :])
    assert f"{shard}: damaged Parquet shard (" in text and f"{HINT} {shard.parent}" in text, text


@pytest.mark.parametrize("kind", ["middle", "truncated", "empty", "missing", "magic", "footer-recorded", "page-recorded"])
def test_corpus_stats(run, cli, kind):
    shard = run / "questions" / "part-00000.parquet"
    damage(shard, kind, "dataset")
    assert_named(cli("corpus", "stats", run, "--json", check=False), shard)


@pytest.mark.parametrize("kind", ["middle", "truncated-recorded", "page-recorded"])
def test_corpus_merge(run, cli, tmp_path, kind):
    shard = run / "documents" / "part-00000.parquet"
    damage(shard, kind, "title")
    out = tmp_path / "merged"
    assert_named(cli("corpus", "merge", run, "--out", out, check=False), shard)
    assert not (out / "documents" / "part-00000.parquet").exists()


@pytest.mark.parametrize("kind, table", [("empty", "chains"), ("middle", "questions"), ("magic-recorded", "chains"), ("page-recorded", "chains")])
def test_export_sft(run, cli, tmp_path, kind, table):
    shard = run / table / "part-00000.parquet"
    damage(shard, kind, "text")
    out = tmp_path / "sft.json"
    assert_named(cli("export", "sft", run / "chains", "--corpus", run, "--out", out, check=False), shard)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["truncated", "footer-recorded", "page-recorded"])
def test_export_kto(run, cli, tmp_path, kind):
    shard = run / "triples" / "part-00000.parquet"
    damage(shard, kind, "head")
    out = tmp_path / "kto.json"
    proc = cli("export", "kto", tmp_path / "responses.jsonl", "--corpus", run, "--triples", run / "triples", "--out", out, check=False)
    assert_named(proc, shard)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["middle", "missing", "page-recorded"])
def test_index_build(run, cli, tmp_path, kind):
    shard = run / "triples" / "part-00000.parquet"
    damage(shard, kind, "docid")
    out = tmp_path / "index"
    assert_named(cli("index", "build", run / "triples", "--tokenizer", "llama3", "--kind", "trie", "--out", out, check=False), shard)
    assert not (out / "index.json").exists()


@pytest.mark.parametrize("kind", ["empty", "magic-recorded", "gone"])
def test_eval_recall(run, cli, tmp_path, kind):
    shard = run / "triples" / "part-00000.parquet"
    damage(shard, kind)
    assert_named(cli("eval", "recall", tmp_path / "responses.jsonl", "--corpus", run, "--triples", run / "triples", "--json", check=False), shard)


@pytest.mark.parametrize("kind", ["middle", "footer-recorded"])
def test_triples_extract_names_the_shard_before_any_request(run, cli, tmp_path, kind):
    from llm_helpers import FlakyServer

    shard = run / "documents" / "part-00000.parquet"
    damage(shard, kind)
    server = FlakyServer({}, flaky=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = cli("triples", "extract", run, "--out", tmp_path / "out", "--backend", "openai", "--base-url", server.url,
                   "--model", "test-model", check=False)  # fmt: skip
        assert_named(proc, shard)
        assert server.posts == []  # found before the first request
    finally:
        server.shutdown()


@pytest.mark.parametrize("kind, problem", [("middle", "sha256 does not match"), ("page-recorded", "not readable as Parquet")])
def test_validate_reports_what_the_hint_sends_the_user_to(run, cli, kind, problem):
    """The commands' hint is `grtool validate`: it must find the damage too, also one only a full read finds."""
    shard = run / "documents" / "part-00000.parquet"
    damage(shard, kind, "text")
    proc = cli("validate", run, check=1)
    assert f"part-00000.parquet: {problem}" in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------------------------- disk full


def _grtool(*args: object, stdout) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True)


def test_disk_full_on_stdout(pristine):
    """`--out -` into /dev/full: every write to standard output fails with ENOSPC."""
    with open("/dev/full", "wb") as full:
        proc = _grtool("corpus", "ingest", EXAMPLES / "2wikimultihopqa", "--out", "-", stdout=full)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    errors = [line for line in unstamped(proc.stderr) if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    text = flat(proc.stderr[proc.stderr.index("error:") :])
    assert "standard output (/dev/full): no space left on the device" in text, text
    # A --json report printed to a full stdout is the same one line.
    with open("/dev/full", "wb") as full:
        proc = _grtool("corpus", "stats", pristine, "--json", stdout=full)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "no space left" in proc.stderr, proc.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (we run as root in CI); skipped where mounting is not permitted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({proc.stderr.strip() or 'mount failed'}): disk-full on files untested")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(mount: Path, leave: int) -> Path:
    """Fill ``mount`` until ``leave`` bytes are free."""
    filler = mount / "filler"
    free = shutil.disk_usage(mount).free
    with open(filler, "wb") as f:
        try:
            f.write(b"\0" * max(0, free - leave))
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return filler


def test_disk_full_on_files_then_resume(small_disk, cli, pristine):
    out = small_disk / "merged"
    filler = _fill(small_disk, 48 * 1024)  # room for the spill, the manifests and a few shards, not for all
    proc = cli("corpus", "merge", pristine, "--out", out, "--rows-per-part", "4", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in unstamped(proc.stderr) if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    text = flat(proc.stderr[proc.stderr.index("error:") :])
    # a part or its shard record, whichever the full disk refuses first (their sizes decide)
    shard = re.escape(str(out)) + r"/(documents|questions)/(part-\d{5}\.parquet|_shards/part-\d{5}\.json)"
    assert re.search(shard + r": no space left on the device while writing it \(\d+ bytes being written, [\d.]+ \S+ free of ", text), text
    assert "re-run the same command to resume" in text, text
    assert not list(out.rglob("*.tmp"))  # the failed shard's temporary file does not keep the space
    filler.unlink()  # free the space, then the same command finishes the run
    cli("corpus", "merge", pristine, "--out", out, "--rows-per-part", "4")
    cli("validate", out)
    assert read_table(out / "documents").num_rows == read_table(pristine / "documents").num_rows
    assert read_table(out / "questions").num_rows == read_table(pristine / "questions").num_rows


# -------------------------------------------------------------------------------------- non-UTF-8 names


def test_validate_json_with_a_non_utf8_file_name(run, cli):
    odd = os.fsencode(str(run)) + b"/documents_\xff\xfe"
    os.makedirs(odd)
    shutil.copy(run / "documents" / "part-00000.parquet", os.path.join(odd, b"part-00000.parquet"))  # an orphan shard
    proc = cli("validate", run, "--json", check=1)
    report = json.loads(proc.stdout)
    paths = [s["path"] for s in report["stages"]]
    assert any(p.endswith("documents_\\xff\\xfe") for p in paths), paths
    assert "Traceback" not in proc.stderr
    plain = cli("validate", run, check=1)  # the table view prints it too
    assert "documents_\\xff\\xfe" in plain.stdout + plain.stderr and "Traceback" not in plain.stderr


@pytest.mark.parametrize("field, value", [("counters.in", 1), ("counters.out", 14), ("counters.rejected", {"made up": 3})])
def test_a_manifest_whose_totals_are_not_its_shards_is_not_read(run, cli, tmp_path, field, value):
    """The totals a report or a guard uses, edited by hand: every reader refuses the stage as validate does (before:
    validate failed it, export read it with exit 0)."""
    manifest_path = run / "chains" / "_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    where, _, key = field.rpartition(".")
    (manifest[where] if where else manifest)[key] = value
    manifest_path.write_text(json.dumps(manifest))
    proc = cli("export", "sft", run / "chains", "--corpus", run, "--out", tmp_path / "sft.json", check=1)
    assert f"{run / 'chains'}: _manifest.json: {field} is" in flat(proc.stderr) and "its shard records sum to" in proc.stderr, proc.stderr
    assert not (tmp_path / "sft.json").exists()
    assert f"_manifest.json: {field} is" in flat(cli("validate", run / "chains", check=1).stdout + cli("validate", run / "chains", check=1).stderr)
