"""Typed records with numeric bounds, each written by its own writer at the edge of its bounds and read back through
its declaration (issue #44: index.json's bound on dollar_row refused what `index build` had just written). The edges:
an empty stage, a part with no row and no reject, a part timed at 0 seconds, a stop of the first task of an array,
an export of no row or of the smallest row, no questions or repeated ones, a lookup of one triple, bracket files of
one docid, a tokenizer whose ids have a gap below the markers. index.json's own edges (one docid: the last row;
markers the highest ids; every docid a collision) are in tests/index/test_index_properties.py."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from conftest import run_cli
from grtool.docid import DOCID_END, DOCID_START
from grtool.store.schemas import TRIPLES
from grtool.store.stage import StageSpec, StageWriter

TRIPLE = {"doc_id": "d-a", "idx": 0, "head": "Kiel", "relation": "located in", "tail": "Baltic Sea",
          "docid": f"{DOCID_START}Kiel, located in, Baltic Sea{DOCID_END}"}  # fmt: skip


def _triples(path: Path, parts: list[list[dict]], rejects: int = 0) -> StageWriter:
    stage = StageWriter(path, StageSpec("triples", TRIPLES, params={"test": True}), num_parts=len(parts))
    for i, rows in enumerate(parts):
        with stage.shard(i) as sh:
            sh.count_in(len(rows) + (rejects if i == 0 else 0))
            for _ in range(rejects if i == 0 else 0):
                sh.reject({"line": "x"}, "no triple")
            sh.write_rows(rows)
    return stage


def _read_back(path: Path) -> dict:
    """The manifest and every shard record through their declarations, and `validate`'s reading of the stage."""
    from grtool.audit.validate import validate_stage
    from grtool.store.records import load_manifest, load_shard_records

    manifest = load_manifest(path)
    assert set(load_shard_records(path)) == set(manifest.shards)
    return {"manifest": manifest, "report": validate_stage(path)}


# ------------------------------------------------------------------------------------------ stage records


def test_an_empty_stage_with_parts_of_no_row_and_no_reject(tmp_path):
    """Rows, counters and rates at 0, the empty-result stop recorded (exit 1, the guard), and the same stage
    allowed empty."""
    from grtool.errors import GuardTripped
    from grtool.store import empty
    from grtool.store.stops import record_stop, stop_record

    stage = _triples(tmp_path / "refused", [[], []])
    with pytest.raises(GuardTripped) as refused:
        stage.finish()
    record_stop(tmp_path / "refused", stop_record(refused.value, "all", ["grtool", "triples", "extract"]))  # as a command's end records it
    got = _read_back(tmp_path / "refused")
    m = got["manifest"]
    assert m.rows == 0 and m.complete and m.counters.in_ == 0 and m.counters.rejected == {}
    assert all(s.rows == 0 and s.rows_per_second in (0.0, None) for s in m.shards.values())
    assert m.stops["all"].guard == "--allow-empty" and m.stops["all"].exit_code == 1
    assert got["report"].problems  # the stop fails the stage until it is re-run or accepted
    with empty.allowing(True):
        _triples(tmp_path / "allowed", [[]], rejects=3).finish()
    got = _read_back(tmp_path / "allowed")
    assert got["manifest"].allow_empty is True and got["manifest"].counters.rejected == {"no triple": 3}
    assert not got["report"].problems, got["report"].problems


def test_a_part_timed_at_0_seconds_has_no_rate(tmp_path, monkeypatch):
    """The part's clock held still from its opening to its commit: seconds 0.0 and no rows per second (a rate
    over 0 seconds would be infinite, which no bound takes); a part of one row timed normally has both."""
    import time

    import grtool.store.stage as stage_module

    monkeypatch.setattr(stage_module, "time", types.SimpleNamespace(monotonic=lambda: 1000.0, time=time.time))
    _triples(tmp_path / "still", [[TRIPLE]]).finish()
    monkeypatch.undo()
    _triples(tmp_path / "timed", [[TRIPLE]]).finish()
    still = _read_back(tmp_path / "still")["manifest"].shards["part-00000"]
    timed = _read_back(tmp_path / "timed")["manifest"].shards["part-00000"]
    assert (still.seconds, still.rows_per_second) == (0.0, None)
    assert timed.seconds >= 0 and (timed.rows_per_second is None) == (timed.seconds == 0)


@pytest.mark.parametrize("task", ["0/1", "2/3", "all"])
@pytest.mark.parametrize("error", ["usage", "data", "transient", "interrupted", "guard"])
def test_a_stop_of_every_exit_code_and_task_edge(tmp_path, task, error):
    """The first and the last task of an array and a whole run, stopped by each kind of error grtool raises."""
    from grtool import errors
    from grtool.store.stops import record_stop, stop_record

    exc = {
        "usage": errors.InputError("bad option"),
        "data": errors.DataProblem("bad rows"),
        "transient": errors.TransientError("server down"),
        "interrupted": errors.GrtoolError("stopped", exit_code=errors.EXIT_INTERRUPTED),
        "guard": errors.GuardTripped("too many rejects", guard="--max-reject-rate", numbers={"rejected": 0, "share": 0.0}),
    }[error]
    stage = _triples(tmp_path / "s", [[TRIPLE]])
    stage.finish()
    record_stop(tmp_path / "s", stop_record(exc, task, ["grtool", "triples", "extract"]))
    stop = _read_back(tmp_path / "s")["manifest"].stops[task]
    assert stop.exit_code == exc.exit_code and stop.task == task


# ----------------------------------------------------------------------------------------- export records


@pytest.mark.parametrize("json_array", [False, True])
@pytest.mark.parametrize("rows", [0, 1])
def test_an_export_of_no_row_or_the_smallest_row(tmp_path, rows, json_array):
    """rows against bytes at their edge (no row in no bytes or in ``[]``; one row of the fewest bytes), and the
    questions of no question and of repeated ones."""
    from grtool.export.formats import export_outputs, row_writers
    from grtool.store.partloop import one_part
    from grtool.vocab.provenance import decode_sidecar, questions_record, sidecar_path, write_sidecar

    out = tmp_path / "gmr.json"
    written = []

    def part(p):
        [writer] = row_writers(p, json_array)
        for _ in range(rows):
            writer.write({"kind": "memorization", "doc_id": "d", "input": "t", "target": "x"})
        writer.close()
        written.append(writer.rows)
        p.shards[0].record = lambda content: write_sidecar(out, kind="gmr", fmt="gmr", rows=writer.rows, json_array=json_array, inputs=[], content=content)

    one_part(export_outputs([out], "gmr", inputs=[]), part)
    assert written == [rows] and decode_sidecar(sidecar_path(out)).bytes == out.stat().st_size
    for qids in ([], ["q2", "q1", "q2"]):
        write_sidecar(out, kind="gmr", fmt="gmr", rows=rows, json_array=json_array, inputs=[], questions=questions_record(qids))
        record = decode_sidecar(sidecar_path(out))
        assert (record.rows, record.bytes) == (rows, out.stat().st_size)
        assert record.questions is not None and record.questions.count == len(set(qids))


# ---------------------------------------------------------------------------------- lookup and index files


def test_the_lookup_of_one_triple(tmp_path):
    """One triple in one document: documents equal to the triples read, one key each way."""
    from grtool.docid.lookup_files import RECORD, load_lookup, open_lookup, read_lookup_record

    stage = _triples(tmp_path / "triples", [[TRIPLE]])
    stage.finish()
    d = open_lookup(tmp_path / "triples", root=tmp_path / "cache").path
    record = read_lookup_record(d)
    assert (record.count, record.documents, record.arrays.fkeys.length) == (1, 1, 1)
    assert load_lookup(d).count == 1 and (d / RECORD).is_file()
    run_cli("validate", d)


def test_the_bracket_files_of_one_docid(tmp_path):
    from grtool.index.docid_bytes import load_docid_bytes, open_docid_bytes, read_docid_bytes_record

    out = tmp_path / "idx"
    run_cli("index", "build", "-", "--tokenizer", "qwen", "--out", out, input=json.dumps(TRIPLE) + "\n")
    assert list(open_docid_bytes(out)) == [b"Kiel, located in, Baltic Sea"]
    assert read_docid_bytes_record(out).docids == 1 and len(list(load_docid_bytes(out))) == 1
    run_cli("validate", out)


def test_a_vocabulary_with_a_gap_below_the_markers(tmp_path):
    """The markers' ids bound by vocab_size: ids past the number of tokens (a vocabulary with a gap below the
    added markers) are still below it, so the index is written and opens."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = [",", "Kiel", "located", "in", "Baltic", "Sea", "[UNK]"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in (DOCID_START, DOCID_END)])
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:  # ids 17 and 18 in a vocabulary of 9 tokens
        added["id"] += 10
        spec["model"]["vocab"][added["content"]] = added["id"]
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text(json.dumps(spec))
    out = tmp_path / "idx"
    run_cli("index", "build", "-", "--tokenizer", tmp_path / "tokenizer", "--out", out, input=json.dumps(TRIPLE) + "\n")
    record = json.loads((out / "index.json").read_text())["tokenizer"]
    assert (record["docid_start_id"], record["docid_end_id"], record["vocab_size"]) == (17, 18, 19)
    got = json.loads(run_cli("index", "query", out, "Kiel, located in, Baltic Sea", "--json").stdout)
    assert got["docs"] == ["d-a"] and got["prefix_ids"][0] == 17
