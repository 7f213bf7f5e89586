"""A damaged index is refused with one line naming the file (never a crash, never a different answer), and a
build stops promptly on SIGINT/SIGTERM leaving no scratch and no temporary index behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grtool.store.schemas import DOCUMENTS
from grtool.store.stage import StageSpec, StageWriter

from index_helpers import BUNDLED


# ------------------------------------------------------------------------------ signals during a build


def _slow_documents(path: Path, docs: int = 150, words: int = 1000) -> Path:
    """Documents sharing a long common text: their suffixes sort slowly (long equal local strings)."""
    stage = StageWriter(path, StageSpec("documents", DOCUMENTS))
    common = " ".join(["alpha beta"] * words)
    with stage.shard(0) as sh:
        sh.count_in(docs)
        sh.write_rows([{"doc_id": f"d{i:05d}", "title": f"t{i}", "text": f"{common} end{i}", "datasets": ["test"]} for i in range(docs)])
    stage.finish()
    return path


def _scratch_dirs(parent: Path) -> list[Path]:
    return [d for t in parent.glob(".idx.*.tmp") for d in t.glob(".fm-build-*")]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 75), (signal.SIGINT, 130)])
def test_signal_stops_the_native_build_and_cleans_up(tmp_path, sig, code):
    """The signal is sent once the native build has started (its scratch directory exists: a state, not a time).
    What the rule says, whatever the machine's speed: the transient code, and either no index and nothing left
    (stopped inside the build) or a complete index (the build had finished first); never scratch left behind."""
    docs = _slow_documents(tmp_path / "docs")
    out = tmp_path / "idx"
    cmd = [sys.executable, "-m", "grtool", "index", "build", str(docs), "--tokenizer", "qwen", "--source", "documents", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not _scratch_dirs(tmp_path):  # the native build has started: its scratch directory exists
            assert proc.poll() is None, f"the build ended before it was signalled: {proc.communicate()}"
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)  # only a guard against a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err
    said = " ".join(err.split())  # one line saying what was left and what to do
    if out.exists():  # the signal came after the build: a complete index, and the code says a signal came
        assert f"{sig.name} received after the command's work was done" in said, err
        subprocess.run([sys.executable, "-m", "grtool", "validate", str(out)], check=True, capture_output=True)
    else:
        assert f"{sig.name} received: the partial index and its scratch files were removed" in said and "run the same command again" in said, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "idx") == ["docs"], "a temporary index or scratch was left behind"


def test_a_rerun_removes_what_a_killed_build_left(tmp_path, cli):
    """SIGKILL runs no cleanup: the next build removes the dead process's temporary index and scratch."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".idx.{dead.pid}.tmp"
    (stale / f".fm-build-{dead.pid}-abc").mkdir(parents=True)
    (stale / f".fm-build-{dead.pid}-abc" / "bwt.suffixes").write_bytes(b"x" * 1000)
    live = tmp_path / f".idx.{os.getpid()}.tmp"  # a build still running (this process) is left alone
    live.mkdir()
    cli("index", "build", "-", "--tokenizer", "qwen", "--out", tmp_path / "idx", input=BUNDLED.read_text(), process=True)  # not this pid
    assert not stale.exists() and live.exists()
    assert not list((tmp_path / "idx").glob(".fm-build-*"))


# ------------------------------------------------------------------------------------- damaged arrays

# Opens each index directory given and answers the queries as `grtool index query --json` does, one JSON line
# per directory; "OPEN dir" first, so a crash names the directory it happened in.
DRIVER = r"""
import json, sys
from grtool.errors import GrtoolError
from grtool.index.base import Index
from grtool.index.query import query
job = json.load(open(sys.argv[1]))
tokenizer = Index.open(job["pristine"]).tokenizer  # loaded once (tokenizer.json is verified at every open)
for d in job["dirs"]:
    print("OPEN", d, flush=True)
    try:
        idx = Index.open(d)
        idx.__dict__["tokenizer"] = tokenizer
        got = {"answers": [query(idx, q) for q in job["queries"]]}
    except GrtoolError as e:
        got = {"error": str(e), "code": e.exit_code}
    except BaseException as e:
        got = {"unexpected": f"{type(e).__name__}: {e}"}
    print(json.dumps({"dir": d, **got}), flush=True)
"""

DAMAGES = ("bytes", "noise", "truncate", "empty", "swap", "missing")


@pytest.fixture(scope="module")
def fm_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pristine") / "idx"
    subprocess.run([sys.executable, "-m", "grtool", "index", "build", "-", "--tokenizer", "qwen", "--out", str(out)],
                   input=BUNDLED.read_text(), text=True, check=True, capture_output=True)  # fmt: skip
    return out


def _queries(index_dir: Path) -> list[list[int]]:
    """Every docid whole, its prefixes, and the empty prefix: next tokens, counts, locate and documents."""
    from grtool.index.base import Index

    idx = Index.open(index_dir)
    import pyarrow.parquet as pq

    queries: list[list[int]] = [[]]
    for docid in pq.read_table(index_dir / "docids.parquet").column("docid").to_pylist():
        ids = idx.tokenizer.encode(docid)
        queries += [ids, ids[:2], ids[: len(ids) // 2]]
    return queries


def _damage(pristine: Path, target: Path, name: str, how: str, rng, bypass: bool) -> None:
    """A copy of the index (untouched files hard-linked) with `name` damaged; ``bypass``: index.json is made
    to record the damaged file, so only the loading checks and the native bounds checks stand in the way."""
    target.mkdir(parents=True)
    for f in pristine.iterdir():
        if f.name not in (name, "index.json"):
            os.link(f, target / f.name)
    data = (pristine / name).read_bytes()
    arrays = sorted(f.name for f in pristine.glob("*.npy"))
    if how == "bytes":  # a few bytes overwritten in place
        at = int(rng.integers(0, len(data) - 16)) if len(data) > 16 else 0
        data = data[:at] + rng.bytes(min(16, len(data))) + data[at + 16 :]
    elif how == "noise":
        data = rng.bytes(len(data))
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = b""
    elif how == "swap":  # another array's content under this name
        data = (pristine / arrays[(arrays.index(name) + 1) % len(arrays)]).read_bytes()
    if how != "missing":
        (target / name).write_bytes(data)
    meta = json.loads((pristine / "index.json").read_text())
    if bypass:
        from grtool.store.fingerprints import file_hash

        if how == "missing":
            del meta["files"][name]
        else:
            meta["files"][name].update(bytes=len(data), blake3=file_hash(target / name))
    (target / "index.json").write_text(json.dumps(meta))


def _run_driver(tmp: Path, pristine: Path, dirs: list[Path], queries: list[list[int]]) -> dict[str, dict]:
    job = tmp / "job.json"
    job.write_text(json.dumps({"pristine": str(pristine), "dirs": [str(d) for d in dirs], "queries": queries}))
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(job)], capture_output=True, text=True, timeout=600)
    lines = proc.stdout.splitlines()
    last_open = next((ln for ln in reversed(lines) if ln.startswith("OPEN ")), None)
    assert proc.returncode == 0, f"the process died (code {proc.returncode}) at {last_open}: {proc.stderr[-2000:]}"
    return {r["dir"]: r for r in (json.loads(ln) for ln in lines if ln.startswith("{"))}


@pytest.mark.parametrize("bypass", [False, True], ids=["verified", "native-checks"])
def test_a_damaged_array_is_refused_never_a_crash_or_a_different_answer(fm_index, tmp_path, bypass):
    import numpy as np

    rng = np.random.default_rng(25)
    queries = _queries(fm_index)
    names = sorted(f.name for f in fm_index.glob("*.npy"))
    assert len(names) >= 20  # every FM array, the CSR map, the lengths
    cases = {tmp_path / f"{name}-{how}": (name, how) for name in names for how in DAMAGES}
    for target, (name, how) in cases.items():
        _damage(fm_index, target, name, how, rng, bypass)
    got = _run_driver(tmp_path, fm_index, [fm_index, *cases], queries)
    truth = got[str(fm_index)]["answers"]
    refused = 0
    for target, (name, how) in cases.items():
        r = got[str(target)]
        assert "unexpected" not in r, f"{name} {how}: {r['unexpected']}"
        if "error" in r:
            refused += 1
            assert r["code"] in (1, 2) and "\n" not in r["error"], r
            # verified: the file is named; past the digests the native checks name the index
            assert (name in r["error"]) if not bypass else (str(target) in r["error"]), f"{name} {how}: {r['error']}"
        else:
            assert bypass or r["answers"] == truth, f"{name} {how}: answered differently with no error"
    if not bypass:
        assert refused == len(cases)


def test_the_cli_refuses_a_damaged_index_in_one_line(fm_index, tmp_path, cli):
    import numpy as np

    target = tmp_path / "idx"
    _damage(fm_index, target, "fm_levels.npy", "bytes", np.random.default_rng(1), bypass=False)
    err = cli("index", "query", target, "--ids", "1", check=2).stderr
    assert "fm_levels.npy: content does not match index.json (damaged)" in err and len(err.strip().splitlines()) == 1
    _damage(fm_index, tmp_path / "idx2", "fm_samples.npy", "missing", None, bypass=False)
    assert "fm_samples.npy: missing (damaged)" in cli("index", "query", tmp_path / "idx2", "--ids", "1", check=2).stderr


def test_an_index_from_before_the_digests_opens_with_its_sizes_checked(fm_index, tmp_path, cli):
    """index.json without blake3 (grtool before this check): sizes are checked, content is said to be unverified."""
    old = tmp_path / "old"
    _damage(fm_index, old, "seq_lengths.npy", "intact", None, bypass=False)
    meta = json.loads((old / "index.json").read_text())
    for rec in meta["files"].values():
        del rec["blake3"]
    (old / "index.json").write_text(json.dumps(meta))
    proc = cli("index", "query", old, "--ids", "1", "--json", env={"COLUMNS": "400"})
    assert "content not verified" in proc.stderr
    assert json.loads(proc.stdout) == json.loads(cli("index", "query", fm_index, "--ids", "1", "--json").stdout)
    meta["files"]["fm_levels.npy"]["bytes"] += 8
    (old / "index.json").write_text(json.dumps(meta))
    assert "fm_levels.npy: " in cli("index", "query", old, "--ids", "1", check=2).stderr
