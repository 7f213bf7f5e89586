"""A stage whose run failed (a tripped guard, any fatal error) says so in its manifest: `status` shows it, `validate`
fails it until a run of it succeeds or the failure is accepted (`validate --accept`). The guard trips for real:
`triples extract` against a small OpenAI-compatible server on 127.0.0.1 whose answers hold no triple."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from conftest import write_pipeline_file
from grtool.errors import InputError
from grtool.audit.validate import accept_tree, validate_stage, validate_tree
from grtool.store.status import status

from llm_helpers import hotpot_paragraphs, write_documents
from llm_helpers import ANSWERS, FlakyServer, serve
from llm_helpers import GUARD_ANSWERS

WIDE = {"COLUMNS": "10000"}  # one line per message: nothing asserted is wrapped
GUARD_LINE = "4 of 5 documents gave no triples (80% > --max-empty-share 0.2)"


def _stops(stage) -> dict:
    return json.loads((stage / "_manifest.json").read_text()).get("stops")


def _validate(cli, path, code, *extra):
    proc = cli("validate", path, *extra, check=code, env=WIDE)
    return proc.stderr


def test_tripped_guard_fails_validate_until_rerun_passes_or_accepted(tmp_path, cli):
    docs = hotpot_paragraphs(len(GUARD_ANSWERS))
    documents = write_documents(tmp_path / "corpus" / "documents", docs)
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, GUARD_ANSWERS)}, flaky=False)
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", documents, "--out", out, "--backend", "openai", "--base-url", server.url)
    try:
        cli(*args, check=1, env=WIDE)
        # Every part is committed: the rows alone look complete, the manifest says the run failed.
        stop = _stops(out / "triples")["all"]
        assert stop["kind"] == "guard" and stop["guard"] == "--max-empty-share" and stop["accepted"] is None
        assert stop["numbers"] == {"part": "part-00000", "units": "documents", "empty": 4, "total": 5, "share": 0.8, "max_empty_share": 0.2}
        assert GUARD_LINE in stop["message"] and stop["exit_code"] == 1 and stop["when"]
        assert stop["command"][:3] == ["grtool", "triples", "extract"] and server.url in stop["command"]
        assert _stops(out / "llm_calls")["all"]["guard"] == "--max-empty-share"  # every output of the failed command

        st = status(out / "triples")
        assert st["parts_pending"] == [] and st["complete"] is False and st["stops"][0].guard == "--max-empty-share"
        table = cli("status", out, env=WIDE).stderr
        assert "no: guard --max-empty-share tripped" in table and GUARD_LINE in table
        text = _validate(cli, out, 1)
        assert "FAIL" in text and f"stopped: guard --max-empty-share tripped at {stop['when']}: part-00000: {GUARD_LINE}" in text
        assert f"grtool validate {out / 'triples'} --accept" in text
        reports = {r.table: r for r in validate_tree(out)}
        assert not reports["triples"].ok and reports["triples"].stops[0].numbers["empty"] == 4  # validate --json shows it
        # A command reading the failed stage refuses it (before: read as a whole stage, exit 0) until it is accepted.
        refused = cli("triples", "collisions", out, "--corpus", documents, check=2, env=WIDE).stderr
        assert f"{out / 'triples'}: the run that wrote it failed (guard --max-empty-share tripped" in refused, refused
        assert f"grtool validate {out / 'triples'} --accept --reason TEXT" in refused, refused

        # Accepted explicitly: who, when, why; validate passes and says so.
        accepted = _validate(cli, out, 0, "--accept", "--reason", "five documents, expected")
        assert f"accepted: {out / 'triples'}: guard --max-empty-share tripped" in accepted
        assert "note: stop accepted by" in accepted and "(five documents, expected): guard --max-empty-share tripped" in accepted
        acc = _stops(out / "triples")["all"]["accepted"]
        assert acc["reason"] == "five documents, expected" and "@" in acc["by"] and acc["when"] and "--accept" in acc["command"]
        assert status(out / "triples")["complete"] is True
        cli("triples", "collisions", out, "--corpus", documents, env=WIDE)  # accepted: read as it is
        with pytest.raises(InputError, match="has a failed run to accept"):
            accept_tree(out)  # nothing left to accept: an --accept left in a CI script fails

        # The same command again: the guard trips from the recorded counts; the old acceptance does not cover it.
        cli(*args, check=1, env=WIDE)
        assert _stops(out / "triples")["all"]["accepted"] is None
        assert not all(r.ok for r in validate_tree(out))

        # A run that passes (a looser guard over the same finished part) clears the record.
        cli(*args, "--max-empty-share", "0.8", env=WIDE)
        assert _stops(out / "triples") == {} and _stops(out / "llm_calls") == {}
        assert all(r.ok and not r.notes and not r.stops for r in validate_tree(out))
        assert status(out / "triples")["complete"] is True
    finally:
        server.shutdown()


def test_accept_claims_the_stage_and_is_refused_while_a_run_of_it_is_live(tmp_path, cli):
    """`validate --accept` writes the stage's manifest: it claims the stage as a run does, so a rerun of the stage
    in progress (held with its run lock) makes it exit 75 naming that run, the stop unaccepted (before: the
    acceptance was written under the live run)."""
    import os

    docs = hotpot_paragraphs(len(GUARD_ANSWERS))
    documents = write_documents(tmp_path / "corpus" / "documents", docs)
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, GUARD_ANSWERS)}, flaky=False)
    serve(server)
    out, holds = tmp_path / "out", tmp_path / "holds"
    holds.mkdir()
    args = ["triples", "extract", documents, "--out", out, "--backend", "openai", "--base-url", server.url]
    try:
        cli(*args, check=1, env=WIDE)
        rerun = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 env={**os.environ, "GRTOOL_HOLD": f"locked:{holds}"})  # fmt: skip
        try:
            while not (holds / "locked.reached").exists():  # a state, not a time: the rerun holds its first output
                assert rerun.poll() is None, rerun.stderr.read().decode()[-3000:]
                time.sleep(0.01)
            refused = _validate(cli, out, 75, "--accept")
            assert f"pid {rerun.pid}" in refused and "this command cannot write it at the same time" in refused, refused
            assert _stops(out / "triples")["all"]["accepted"] is None
            assert _stops(out / "llm_calls")["all"]["accepted"] is None  # all or nothing: no stage accepted before the refusal
        finally:
            (holds / "locked.release").write_text("")
            rerun.communicate(timeout=600)
        assert rerun.returncode == 1  # the same guard trips again
        _validate(cli, out, 0, "--accept")  # no run live: accepted
        assert _stops(out / "triples")["all"]["accepted"] is not None
    finally:
        server.shutdown()


def test_array_task_stop_stays_until_that_task_or_a_whole_run_passes(tmp_path, cli):
    docs = hotpot_paragraphs(4)
    documents = write_documents(tmp_path / "corpus" / "documents", docs, num_parts=2)
    # Part 0 (task 0 of 2) gets empty answers, part 1 (task 1) real triples.
    answers = [("", "stop"), ("", "stop"), ANSWERS[0][:2], ANSWERS[1][:2]]
    server = FlakyServer({d["title"]: a for d, a in zip(docs, answers)}, flaky=False)
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", "--grounding", "off", documents, "--out", out, "--backend", "openai", "--base-url", server.url)
    try:
        cli(*args, "--num-shards", "2", "--shard-index", "0", check=1, env=WIDE)
        cli(*args, "--num-shards", "2", "--shard-index", "1", env=WIDE)
        assert set(_stops(out / "triples")) == {"0/2"}  # task 1 passing leaves task 0's failure standing
        report = validate_stage(out / "triples")
        assert any(p.startswith("stopped: guard --max-empty-share tripped in task 0/2 (--shard-index/--num-shards)") for p in report.problems)
        assert status(out / "triples")["complete"] is False

        cli(*args, "--max-empty-share", "1", env=WIDE)  # a whole run judges every part: it clears every task's stop
        assert _stops(out / "triples") == {}
        assert all(r.ok for r in validate_tree(out))
    finally:
        server.shutdown()


def test_an_error_is_recorded_an_interruption_leaves_it_a_passing_resume_clears_it(tmp_path, cli):
    docs = hotpot_paragraphs(2)
    documents = write_documents(tmp_path / "corpus" / "documents", docs)
    server = QuietServer({d["title"]: a[:2] for d, a in zip(docs, ANSWERS)}, flaky=False, broken_titles={docs[1]["title"]})
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", "--grounding", "off", documents, "--out", out, "--backend", "openai", "--base-url", server.url,
            "--max-retries", "0", "--timeout", "30")  # fmt: skip
    try:
        cli(*args, check=75, env=WIDE)  # a server error after the retries is transient: no failure of the stage
        assert _stops(out / "triples") == {}

        server.broken_status = 400  # a bad request is: recorded
        failed = cli(*args, check=2, env=WIDE)
        stop = _stops(out / "triples")["all"]
        assert stop["kind"] == "error" and stop["guard"] is None and stop["exit_code"] == 2
        assert "HTTP 400" in stop["message"] and stop["message"] in failed.stderr
        report = validate_stage(out / "triples")
        assert any(p.startswith("stopped: run failed (exit 2)") and "HTTP 400" in p for p in report.problems)

        # Ctrl-C is not a failure (the run is resumable) and not a success: the recorded stop stays as it was.
        server.broken_titles, server.flaky, server.failures_sent = set(), True, 3  # the next request: the server stalls
        server.seen.clear()
        sent = len(server.posts)
        proc = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while len(server.posts) == sent and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(server.posts) > sent
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode != 0, err
        assert _stops(out / "triples") == {"all": stop}

        server.flaky = False
        cli(*args, env=WIDE)  # resumes the unfinished part and passes
        assert _stops(out / "triples") == {}
        assert all(r.ok for r in validate_tree(out))
    finally:
        server.shutdown()


class QuietServer(FlakyServer):
    def handle_error(self, request, client_address) -> None:
        pass  # an interrupted client is gone before the answer is written: a broken pipe, expected


def test_pipeline_records_the_failed_stage_only_with_its_own_command(tmp_path, examples, cli):
    server = FlakyServer(defaultdict(lambda: ("I found nothing.", "stop")), flaky=False)
    serve(server)
    run = tmp_path / "run"
    config = write_pipeline_file(tmp_path / "pipe.toml", [
        {"name": "ingest", "run": "corpus ingest", "args": [examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"], "options": {"out": "{out}/corpus"}},
        {"name": "triples", "run": "triples extract", "args": ["{out}/corpus"],
         "options": {"out": "{out}/extract", "backend": "openai", "base-url": server.url, "limit": 3}},
    ], out=run)  # fmt: skip
    try:
        proc = cli("pipeline", "run", config, check=1, env=WIDE)
        assert "stage 'triples' failed" in proc.stderr and "3 of 3 documents gave no triples" in proc.stderr
        for table in ("documents", "questions"):
            assert _stops(run / "corpus" / table) == {}  # the stage before succeeded
        stop = _stops(run / "extract" / "triples")["all"]
        assert stop["guard"] == "--max-empty-share" and stop["message"].startswith("part-00000: 3 of 3 documents")
        from grtool.pipeline.config import load_pipeline

        stage = next(s for s in load_pipeline(config).stages if s.name == "triples")
        assert stop["command"] == shlex.split(stage.command_line())
        _validate(cli, run, 1)
    finally:
        server.shutdown()


def test_manifest_without_stops_reads_and_a_damaged_one_is_named(tmp_path):
    stage = write_documents(tmp_path / "documents", hotpot_paragraphs(3))
    manifest = json.loads((stage / "_manifest.json").read_text())
    assert manifest["stops"] == {}
    del manifest["stops"]  # as grtool wrote it before the field existed
    (stage / "_manifest.json").write_text(json.dumps(manifest))
    assert validate_stage(stage).ok
    st = status(stage)
    assert st["complete"] is True and st["stops"] == []

    manifest["stops"] = {"all": {"task": "all", "kind": "guard", "guard": "--max-empty-share", "message": 3}}
    (stage / "_manifest.json").write_text(json.dumps(manifest))
    assert "field stops.all.message: expected `str`, got `int` (edited or damaged)" in validate_stage(stage).problems[0]
