"""Empty results fail the gates (#35): a stage or export that writes no row exits 1 with the reasons unless
--allow-empty, `validate` reports empty stages and exports, and triples of another corpus are named as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.store.empty import EmptyResult, allowing, check_rows, top_reasons
from grtool.store.schemas import CHAINS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, read_table
from grtool.store.records import load_manifest
from grtool.triples.evidence import write_evidence_stage
from conftest import EXAMPLES, run_cli


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """The bundled 2Wiki example with its evidence triples; the HotpotQA example, whose documents the 2Wiki
    triples do not name; and triples of one 2Wiki document that no question has for gold."""
    root = tmp_path_factory.mktemp("empty")
    run_cli("-q", "corpus", "ingest", EXAMPLES / "2wikimultihopqa" / "data_ids_dev.example.json", "--out", root / "wiki")
    run_cli("-q", "corpus", "ingest", EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", "--out", root / "hotpot")
    assert write_evidence_stage(root / "wiki", root / "triples") > 0
    gold = {g for q in read_table(root / "wiki" / "questions").to_pylist() for g in q["gold_doc_ids"]}
    other = next(d["doc_id"] for d in read_table(root / "wiki" / "documents").to_pylist() if d["doc_id"] not in gold)
    stage = StageWriter(root / "off-gold", StageSpec("triples", TRIPLES, {"source": "test"}), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(1)
        shard.write_rows([{"doc_id": other, "idx": 0, "head": "A", "relation": "r", "tail": "B", "docid": "<docid_start>A, r, B<docid_end>"}])
    stage.finish()
    return {"root": root, "wiki": root / "wiki", "hotpot": root / "hotpot", "triples": root / "triples", "off_gold": root / "off-gold"}


def test_triples_of_another_corpus_are_named_by_every_command_that_joins_them(cli, data, tmp_path):
    """The issue's first example: `chains gold` against another corpus's triples printed "0 questions chained"
    and exited 0. Now it, the filters, the recall and the collisions report name both directories, exit 1,
    and write nothing (--allow-empty does not wave a mismatch through)."""
    expected = f"the triples in {data['triples']} cover none of the"
    chains = tmp_path / "chains"
    for allow in ([], ["--allow-empty"]):
        proc = cli("chains", "gold", data["hotpot"], "--triples", data["triples"], "--out", chains, *allow, check=1)
        assert expected in proc.stderr and f"corpus {data['hotpot'] / 'documents'}" in proc.stderr
        assert "are these triples from this corpus?" in proc.stderr and not chains.exists()
    # filters apply (chains joined with the wrong corpus)
    qid = read_table(data["wiki"] / "questions").column("qid")[0].as_py()
    write_chains(tmp_path / "wiki-chains", [{"qid": qid, "candidate": 0, "text": "x", "docids": [], "flipped": [], "selected": True}])
    proc = cli("filters", "apply", tmp_path / "wiki-chains", "--corpus", data["hotpot"], "--triples", data["triples"], "--out", tmp_path / "f", check=1)
    assert expected in proc.stderr and not (tmp_path / "f").exists()
    # eval recall and triples collisions --corpus
    responses = tmp_path / "responses.jsonl"
    responses.write_text(json.dumps({"qid": "x", "response": "nothing"}) + "\n")
    assert expected in cli("eval", "recall", responses, "--corpus", data["hotpot"], "--triples", data["triples"], check=1).stderr
    assert expected in cli("triples", "collisions", data["triples"], "--corpus", data["hotpot"], check=1).stderr
    # partial coverage is normal: the wiki triples (of a few documents) with the wiki corpus pass
    assert "cover none" not in cli("triples", "collisions", data["triples"], "--corpus", data["wiki"]).stderr


def text(proc) -> str:
    """What a command showed (its tables and lines go to stderr, as logs do)."""
    return proc.stdout + proc.stderr


def write_chains(path: Path, rows: list[dict]) -> None:
    stage = StageWriter(path, StageSpec("chains", CHAINS), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(len(rows))
        shard.write_rows(rows)
    stage.finish()


def test_an_empty_stage_exits_1_with_its_reasons_is_recorded_and_fails_validate(cli, data, tmp_path):
    """Triples of this corpus, but of no gold document: every question is rejected. Exit 1 with the reason and
    count; the manifest records the stop (status shows it, validate fails it, a resume judges it again);
    --accept or a run with --allow-empty lets it pass."""
    chains = tmp_path / "chains"
    args = ["chains", "gold", data["wiki"], "--triples", data["off_gold"], "--out", chains]
    proc = cli(*args, check=1)
    n = len(read_table(data["wiki"] / "questions"))
    assert f"{chains}: no rows written: all {n} input rows were rejected: 'gold documents without triples' ×{n}" in proc.stderr
    assert "were triples extracted for the questions' gold documents?" in proc.stderr and "--allow-empty" in proc.stderr
    assert proc.stderr.count("error:") == 1
    stop = load_manifest(chains).stops["all"]
    assert (stop.kind, stop.guard, stop.accepted) == ("guard", "--allow-empty", None)
    assert "guard --allow-empty tripped" in text(cli("status", chains))
    assert "guard --allow-empty tripped" in text(cli("validate", chains, check=1))
    assert "no rows written" in cli(*args, check=1).stderr  # a resume finds every part done and judges it again
    # accepted: a note, validate passes
    cli("validate", chains, "--accept", "--reason", "no gold triples on purpose")
    assert cli("validate", chains).returncode == 0
    # a run with --allow-empty succeeds, clears the stop and records that it allowed the empty result
    cli(*args, "--allow-empty")
    manifest = load_manifest(chains)
    assert manifest.allow_empty is True and manifest.stops == {} and manifest.rows == 0
    assert "empty (allowed by --allow-empty)" in text(cli("validate", chains))


def test_filters_on_empty_chains_and_the_export_of_an_empty_stage(cli, data, tmp_path):
    """The issue's chain of silent steps: filters on empty chains exit 1; the SFT export of an empty stage writes
    and registers nothing; with --allow-empty each goes on, and validate says the emptiness was allowed."""
    chains, filtered, export = tmp_path / "chains", tmp_path / "filtered", tmp_path / "export" / "sft.json"
    cli("-q", "chains", "gold", data["wiki"], "--triples", data["off_gold"], "--out", chains, "--allow-empty")
    filters = ["filters", "apply", chains, "--corpus", data["wiki"], "--triples", data["off_gold"], "--out", filtered]
    assert f"its input {chains} has no rows" in cli(*filters, check=1).stderr
    cli("-q", *filters, "--allow-empty")
    sft = ["export", "sft", filtered, "--corpus", data["wiki"], "--out", export, "--format", "llamafactory-alpaca"]
    proc = cli(*sft, check=1)
    assert f"{export}: no rows written: its input {filtered} has no chains" in proc.stderr
    assert not export.exists() and not (export.parent / "dataset_info.json").exists() and not list(export.parent.glob("*.grtool.json"))
    cli("-q", *sft, "--allow-empty")
    assert json.loads(export.read_text()) == [] and "sft" in json.loads((export.parent / "dataset_info.json").read_text())
    shown = text(cli("validate", tmp_path))
    assert shown.count("empty (allowed by --allow-empty)") == 3  # chains, filtered, the export


def test_an_export_that_rejects_every_chain(cli, data, tmp_path):
    """Chains of this corpus, none of them selected: the export says why (the reason and its count)."""
    rows = read_table(data["root"] / "wiki" / "questions").to_pylist()[:2]
    chains = tmp_path / "chains"
    write_chains(chains, [{"qid": r["qid"], "candidate": 0, "text": "x", "docids": [], "flipped": [], "selected": False} for r in rows])
    out = tmp_path / "sft.jsonl"
    proc = cli("export", "sft", chains, "--corpus", data["wiki"], "--out", out, "--format", "trl-messages", check=1)
    assert f"all {len(rows)} input chains were rejected: 'not selected (pass --all-candidates)' ×{len(rows)}" in proc.stderr
    assert not out.exists()


def test_validate_reports_an_empty_export_and_stage_unless_accepted(cli, data, tmp_path):
    """Outputs made before the rule (or edited): a 0-row stage and a `[]` export fail validate; --accept-empty PATH
    (as a path, or relative to the validated directory) accepts each for that validation; a PATH naming no
    empty output is a usage error."""
    stage = StageWriter(tmp_path / "run" / "chains", StageSpec("chains", CHAINS), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(2)
        shard.reject({"qid": "q1"}, "no answer")
        shard.reject({"qid": "q2"}, "no answer")
    with allowing(True):
        stage.finish()
    manifest_path = tmp_path / "run" / "chains" / "_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("allow_empty")  # as an older grtool wrote it
    manifest_path.write_text(json.dumps(manifest))
    export = tmp_path / "run" / "export" / "sft.json"
    cli("-q", "chains", "gold", data["wiki"], "--triples", data["off_gold"], "--out", tmp_path / "gold", "--allow-empty")
    cli("-q", "export", "sft", tmp_path / "gold", "--corpus", data["wiki"], "--out", export, "--format", "llamafactory-alpaca", "--allow-empty")
    sidecar = export.with_name("sft.json.grtool.json")
    meta = json.loads(sidecar.read_text())
    meta.pop("allow_empty")
    sidecar.write_text(json.dumps(meta))

    shown = text(cli("validate", tmp_path / "run", check=1))
    assert "empty: no rows ('no answer' ×2; re-run with --allow-empty" in shown
    assert shown.count("--accept-empty") == 2
    partly = text(cli("validate", tmp_path / "run", "--accept-empty", "chains", check=1))  # relative to DIRECTORY
    assert "empty (accepted by --accept-empty)" in partly and "FAIL" in partly
    cli("validate", tmp_path / "run", "--accept-empty", "chains", "--accept-empty", export)
    assert "--accept-empty" in cli("validate", tmp_path / "run", "--accept-empty", "nothing-here", check=2).stderr


def test_the_pipeline_passes_allow_empty_to_a_stage(cli, data, tmp_path, write_pipeline):
    config = write_pipeline(
        [{"name": "gold", "run": "chains gold", "args": [data["wiki"]], "options": {"triples": data["off_gold"], "out": "{out}/chains", "allow_empty": True}}], out=tmp_path / "out"
    )
    assert "--allow-empty" in cli("pipeline", "run", config, "--dry-run").stdout
    cli("-q", "pipeline", "run", config)
    assert load_manifest(tmp_path / "out" / "chains").allow_empty is True


def test_the_line_names_the_most_frequent_reasons():
    assert top_reasons({"b": 1, "a": 5, "c": 1, "d": 2}) == "'a' ×5, 'd' ×2, 'b' ×1 and 1 more reasons ×1"
    with pytest.raises(EmptyResult, match=r"out: no rows written: all 3 input rows were rejected: 'x' ×3"):
        check_rows("out", 3, 0, {"x": 3})
    with allowing(True):
        check_rows("out", 3, 0, {"x": 3})  # allowed
    check_rows("out", 3, 1, {"x": 2})  # not empty
