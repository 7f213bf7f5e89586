"""The newcomer's page (#48), docs/guides/own-data.md, runs as written: every command of its bash blocks, in order,
in a fresh directory holding only the repository's examples/ (own QA file in the inline layout → ingest → split →
triples for two questions with the embedded model → stats, status, validate → a Slurm dry run), each exiting 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from docs_helpers import REPO, SHELL_BLOCK

PAGE = REPO / "docs" / "guides" / "own-data.md"


def page_commands() -> list[str]:
    """The page's shell commands in order (continuation lines joined, comment lines dropped)."""
    commands = []
    for block in SHELL_BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        commands += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.strip().startswith("#")]
    return commands


def test_the_page_walks_the_whole_newcomer_path():
    words = [" ".join(c.split()[:3]) for c in page_commands()]
    assert words == [
        "grtool corpus ingest",
        "grtool corpus split",
        "grtool triples extract",
        "grtool corpus stats",
        "grtool status out/mine/run/triples",
        "grtool validate out/mine",
        "grtool pipeline run",
    ]
    assert "examples/data/inline/qa.jsonl" in page_commands()[0] and "--questions" in page_commands()[2]
    assert "--executor slurm --dry-run" in page_commands()[-1]


@pytest.mark.slow
def test_the_page_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(REPO / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "grtool"  # `grtool` as the page writes it: this interpreter's grtool (the tests' PYTHONPATH)
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m grtool "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in page_commands():
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\nexited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    # what the page promises: splits made, triples of two train questions' documents only, the plan of every job
    questions = subprocess.run([str(shim), "corpus", "stats", "out/mine/corpus", "--triples", "out/mine/run/triples", "--json"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, check=True)  # fmt: skip
    stats = json.loads(questions.stdout)
    assert {group["split"] for group in stats["groups"]} == {"train", "dev", "test"}
    coverage = stats["coverage"]  # only two train questions' documents were extracted: most gold is unreachable
    assert coverage["gold_documents"] > coverage["reachable"] and {s["split"] for s in coverage["splits"]} == {"train", "dev", "test"}
    assert all(s["reachable"] == 0 for s in coverage["splits"] if s["split"] != "train")
    manifest = json.loads((tmp_path / "out" / "mine" / "run" / "triples" / "_manifest.json").read_text())
    assert manifest["params"]["questions"]["count"] == 2 and manifest["params"]["questions"]["split"] == ["train"]
    assert 0 < manifest["counters"]["extra"]["documents"] <= 4
    assert not (tmp_path / "out" / "mine-cluster").exists()  # a dry run submits and writes nothing
