"""The Slurm executor's plan without a cluster: a small pipeline file to plan (tests/pipeline/test_pipeline_slurm_plan.py and the
Slurm safety tests)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import REPO


def plan_config(tmp_path, extra: str = "", triples_slurm: str = "{ tasks = 3 }", out: Path | None = None) -> str:
    """Three stages (ingest, triples as an array, index) under ``out`` (default TMP/run), any path quoted for TOML."""
    hotpot = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    path = tmp_path / "pipe.toml"
    extra = extra.replace("\n", "\n        ")  # kept inside the dedented text
    path.write_text(
        textwrap.dedent(f"""
        out = {json.dumps(str(out or tmp_path / "run"))}
        [slurm]
        partition = "cpu"
        time = "01:00:00"
        {extra}
        [[stages]]
        name = "ingest"
        run = "corpus ingest"
        args = [{json.dumps(str(hotpot))}]
        options = {{ out = "{{out}}/corpus" }}
        [[stages]]
        name = "triples"
        run = "triples extract"
        args = ["{{out}}/corpus"]
        options = {{ out = "{{out}}/t", backend = "openai", base_url = "http://127.0.0.1:9/v1" }}
        slurm = {triples_slurm}
        [[stages]]
        name = "index"
        run = "index build"
        args = ["{{out}}/t/triples"]
        options = {{ tokenizer = "qwen", out = "{{out}}/index" }}
        """)
    )
    return str(path)
