"""File and directory names that are not UTF-8: grtool reads stages, indexes and exports under them."""

from __future__ import annotations

import os

from strict_cli_helpers import errors_of, grtool


def test_an_index_under_a_name_that_is_not_utf8_is_queried_and_validated(tmp_path):
    """grtool writes UTF-8 names only; a user may move what it wrote under any name the file system holds."""
    import json

    from index_helpers import BUNDLED, write_triples_stage

    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(tmp_path / "triples", rows)
    built = grtool("index", "build", tmp_path / "triples", "-t", "llama3", "--out", tmp_path / "idx")
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    odd = os.fsencode(tmp_path) + b"/run\xff"
    os.mkdir(odd)
    os.rename(tmp_path / "idx", os.fsdecode(odd + b"/idx"))
    os.rename(tmp_path / "triples", os.fsdecode(odd + b"/triples"))
    query = grtool("index", "query", odd + b"/idx", "Old Harbor Bridge")
    assert query.returncode == 0, query.stderr.decode()[-2000:]
    for target in (odd + b"/idx", odd):
        proc = grtool("validate", target)
        assert proc.returncode == 0 and not errors_of(proc), proc.stderr.decode()[-2000:]


def test_export_sft_reads_stages_under_a_name_that_is_not_utf8(tmp_path):
    from run_helpers import write_small_run

    write_small_run(tmp_path / "run", tmp_path / "responses.jsonl")
    odd = os.fsencode(tmp_path) + b"/run\xff"
    os.rename(tmp_path / "run", os.fsdecode(odd))
    out = tmp_path / "sft.json"
    proc = grtool("export", "sft", odd + b"/chains", "--corpus", odd, "--out", out)
    assert proc.returncode == 0 and not errors_of(proc), proc.stderr.decode()[-2000:]
    assert out.stat().st_size > 0
    proc = grtool("validate", out)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
