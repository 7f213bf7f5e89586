"""`grtool retrieve --mode gmr` with the real embedded model (SmolLM2-135M on the CPU) over a real FM-index of documents.

The corpus is the ingest of our own 2WikiMultihopQA and MuSiQue samples (``sample_helpers.build_samples``), indexed
with ``--source documents``. The model is not trained for GMR, so it rarely says DONE; what matters is that every
step it writes is exactly a document of the corpus (or DONE) and that the loop stops where it should.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from sample_helpers import build_samples

from grtool.vocab.gmr import DONE, render_document
from grtool.store.records import load_manifest
from grtool.store.stage import read_table

pytestmark = pytest.mark.slow

MAX_STEPS = 2
ARGS = ("--mode", "gmr", "--beams", "2", "--max-steps", str(MAX_STEPS), "--limit", "2", "--max-tokens", "160", "--threads", "2")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("retrieve_gmr") / "run"
    build_samples(root)
    run_cli("index", "build", root / "documents", "--source", "documents", "--tokenizer", "default", "--out", root / "dindex")
    return root


@pytest.fixture(scope="module")
def responses(run, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("gmr_out") / "responses"
    proc = run_cli("retrieve", run, "--index", run / "dindex", *ARGS, "--out", out, "--json")
    return out, json.loads(proc.stdout)


def _documents(run: Path) -> dict[str, str]:
    """Rendered document → doc_id, as `export gmr` writes them."""
    return {render_document(d["title"], d["text"]): d["doc_id"] for d in read_table(run / "documents").to_pylist()}


def test_every_step_is_a_document_or_done_and_the_loop_stops(run, responses):
    out, report = responses
    rows = read_table(out).to_pylist()
    assert len(rows) == 2 == report["responses"]
    documents = _documents(run)
    steps_seen = 0
    for row in rows:
        assert row["mode"] == "gmr" and row["markers"] == "documents" and row["docids"] == []
        steps = row["text"].split("\n") if row["text"] else []
        assert len(steps) <= MAX_STEPS
        docs = [s for s in steps if s != DONE]
        for s in docs:
            assert s in documents, f"{row['qid']}: step is no document of the corpus: {s[:200]!r}"
        assert row["n_docids"] == len(docs)
        expected_ids = list(dict.fromkeys(documents[s] for s in docs))  # step order, each document once
        assert row["doc_ids"] == expected_ids
        if row["finish_reason"] == "done":
            assert steps[-1] == DONE and DONE not in steps[:-1]
        elif row["finish_reason"] == "max-steps":
            assert len(steps) == MAX_STEPS and DONE not in steps
        else:
            assert row["finish_reason"] == "length" and DONE not in steps
        assert row["tokens"] > 0 and row["latency_ms"] > 0
        steps_seen += len(docs)
    assert steps_seen > 0
    assert report["hallucinated"] == 0 and report["docids"] == steps_seen


def test_eval_recall_reads_gmr_rows(run, responses):
    out, report = responses
    recall = json.loads(run_cli("eval", "recall", out, "--corpus", run, "--triples", run / "triples", "--json").stdout)
    assert recall["responses"] == report["recall"]["responses"] > 0
    assert recall["recall"] == report["recall"]["recall"] and recall["hallucinated"] == 0


def test_killed_run_resumes_from_the_step_cache(run, responses, tmp_path):
    out, _ = responses
    partial = tmp_path / "partial"
    shutil.copytree(out, partial)
    for f in partial.glob("part-*.parquet"):
        f.unlink()
    proc = run_cli("retrieve", run, "--index", run / "dindex", *ARGS, "--out", partial, "--json")
    assert read_table(partial).to_pylist() == read_table(out).to_pylist(), proc.stderr
    assert load_manifest(partial).complete


def test_document_constraint(run):
    """From the first token (whatever the prompt): document starts and DONE; along a document only its
    continuations; after it only EOS; after DONE only EOS."""
    import numpy as np

    from grtool.index.base import Index
    from grtool.index.constraints import constraint_from_spec
    from grtool.retrieve.stage import constraint_spec

    index = Index.open(run / "dindex")
    eos = (2,)
    constraint = constraint_from_spec(constraint_spec(index, "documents", None), eos_ids=eos)
    tok = index.tokenizer
    document = next(iter(_documents(run)))
    state = constraint.initial([5, 6, 7])
    assert set(tok.encode(DONE)[:1]) <= set(constraint.allowed(state).tolist()) and 2 not in constraint.allowed(state)
    for t in tok.encode(document):
        assert t in constraint.allowed(state)
        state = constraint.advance(state, t)
    assert 2 in constraint.allowed(state)
    state = constraint.initial([])
    for t in tok.encode(DONE):
        assert t in constraint.allowed(state)
        state = constraint.advance(state, t)
    assert np.array_equal(constraint.allowed(state), np.array(eos))


def test_gmr_needs_transformers_and_a_documents_index(run, tmp_path):
    proc = run_cli("retrieve", run, "--index", run / "dindex", "--mode", "gmr", "--backend", "vllm", "--out", tmp_path / "x", check=2)
    assert "--mode gmr" in proc.stderr and "transformers" in proc.stderr
    proc = run_cli("retrieve", run, "--index", run / "dindex", "--out", tmp_path / "y", check=2)  # docids mode, documents index
    assert "--source" in proc.stderr
