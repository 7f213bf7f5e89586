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
