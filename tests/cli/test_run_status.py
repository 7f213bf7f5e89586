"""`grtool status` of a whole run: what the text lists, the JSON lists."""

from __future__ import annotations

from strict_cli_helpers import grtool
from pathlib import Path


def test_status_json_of_a_run_lists_its_indexes_exports_checkpoints_and_pipeline_stages(tmp_path):
    """`status RUN --json`: one object with the stage directories' status (as before, under "stages") beside the
    indexes, exports, training outputs and pipeline stages the tables show; a stage directory keeps its object."""
    import json

    from index_helpers import BUNDLED, write_triples_stage

    run = tmp_path / "run"
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    write_triples_stage(run / "triples", rows)
    assert grtool("index", "build", run / "triples", "-t", "llama3", "--out", run / "index").returncode == 0
    (run / "_pipeline").mkdir()
    (run / "_pipeline" / "triples.json").write_text(
        json.dumps({"stage": "triples", "command": "grtool triples extract", "outputs": [str(run / "triples")], "seconds": 1.5, "finished": "2026-01-01T00:00:00+00:00"})
    )
    proc = grtool("status", run, "--json")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = json.loads(proc.stdout)
    assert sorted(got) == ["checkpoints", "exports", "files", "indexes", "pipeline", "slurm_jobs", "stages"]
    assert [Path(s["path"]).name for s in got["stages"]] == ["triples"] and got["stages"][0]["table"] == "triples"
    assert [Path(i["path"]).name for i in got["indexes"]] == ["index"] and got["indexes"][0]["kind"] == "fm"
    assert got["exports"] == got["checkpoints"] == got["slurm_jobs"] == []
    assert [p["stage"] for p in got["pipeline"]] == ["triples"] and got["pipeline"][0]["seconds"] == 1.5
    alone = json.loads(grtool("status", run / "triples", "--json").stdout)  # a stage directory: its own object
    assert alone == got["stages"][0]
    # An index record its readers refuse is listed as damaged (before: as an fm index, whatever it said).
    meta = json.loads((run / "index" / "index.json").read_text())
    meta["sizes"]["documents"] = -5
    (run / "index" / "index.json").write_text(json.dumps(meta))
    assert json.loads(grtool("status", run, "--json").stdout)["indexes"][0]["kind"] == "damaged"
