"""`grtool chains synthesize` end to end: a real OpenAI-compatible HTTP server on 127.0.0.1, and the tiny model.

Questions and triples come from the tests' own 2WikiMultihopQA records (tests/data): their `evidences` are the (head, relation,
tail) triples of their gold paragraphs, in gold-paragraph order.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from grtool.store.schemas import QUESTIONS, TRIPLES
from grtool.store.stage import StageSpec, StageWriter, read_table
from grtool.store.records import load_manifest
from chains_helpers import TWO_WIKI, E, S, WINNER, build_inputs, doc_id, llm_args, load_2wiki, start_server


def ingest_inputs(cli, root: Path) -> tuple[Path, Path]:
    """The real `corpus ingest` over the tests' 2Wiki records, and a triples stage of each question's evidences,
    each evidence assigned to the gold document of its hop (ingest keeps gold documents in hop order)."""
    cli("-q", "corpus", "ingest", TWO_WIKI, "--out", root / "corpus")
    triples, seen = [], set()
    for q in read_table(root / "corpus" / "questions").to_pylist():
        gold = q["gold_doc_ids"]
        for i, (h, r, t) in enumerate(json.loads(q["meta"])["evidences"]):
            d = gold[min(i, len(gold) - 1)]
            if (d, h, r, t) not in seen:
                seen.add((d, h, r, t))
                triples.append({"doc_id": d, "idx": i, "head": h, "relation": r, "tail": t, "docid": f"{S}{h}, {r}, {t}{E}"})
    w = StageWriter(root / "run" / "triples", StageSpec("triples", TRIPLES), num_parts=1)
    with w.shard(0) as sh:
        sh.count_in(len(triples))
        sh.write_rows(triples)
    w.finish()
    return root / "corpus", root / "run"


# ------------------------------------------------------------------------------------ the server


@pytest.fixture
def records():
    return load_2wiki()


@pytest.fixture
def server(records):
    s = start_server(records)
    yield s
    s.close()


# ------------------------------------------------------------------------------------- the tests


def test_chains_from_an_openai_server_are_normalized_and_the_surest_is_selected(cli, tmp_path, records, server):
    # Three questions cannot have chains, each for its own reason; they must be reported, not dropped.
    records = [dict(r) for r in records]
    no_gold, unanswerable, no_triples = records[0]["_id"], records[1]["_id"], records[2]["_id"]
    corpus, triples, by_text = build_inputs(records, tmp_path)
    _rewrite_questions(corpus, {no_gold: {"gold_doc_ids": []}, unanswerable: {"answerable": False}})
    _drop_triples(triples, {doc_id(records[2]["supporting_facts"][0][0])})

    out = tmp_path / "chains"
    args = ["chains", "synthesize", corpus, "--triples", triples, "--out", out, "--candidates", "4", "--select", "entropy", *llm_args(server)]
    cli(*args, "--num-shards", "2", "--shard-index", "0")
    assert not load_manifest(out).complete
    cli(*args, "--num-shards", "2", "--shard-index", "1")
    manifest = load_manifest(out)
    assert manifest.complete and manifest.params["model"] == "fake-70b"

    c = manifest.counters
    # unanswerable with no meta.context_doc_ids: nothing to offer (--unanswerable keep, the default)
    assert c.rejected == {"gold documents without triples": 1, "no gold documents": 1, "unanswerable without context documents": 1}
    chained = len(records) - 3
    assert c.extra["questions"] == len(records) and c.extra["questions_chained"] == chained
    assert c.out == 4 * chained and c.in_ == c.out + 3
    rejects = [json.loads(line) for f in sorted((out / "_rejects").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert {r["record"]["qid"]: r["reason"] for r in rejects} == {
        no_gold: "no gold documents", unanswerable: "unanswerable without context documents", no_triples: "gold documents without triples",
    }  # fmt: skip

    # Every request asked for logprobs; candidate 0 was greedy, the others sampled with their own seeds.
    assert all(r["logprobs"] and r["top_logprobs"] == 5 for r in server.posts)
    assert sorted({(r["temperature"], r["seed"]) for r in server.posts}) == [(0.0, 0), (0.7, 1), (0.7, 2), (0.7, 3)]
    assert len(server.posts) == 4 * chained

    rows = read_table(out).to_pylist()
    assert len(rows) == 4 * chained
    by_qid: dict[str, list[dict]] = {}
    for r in rows:
        by_qid.setdefault(r["qid"], []).append(r)
    for rec in records[3:]:
        cands = sorted(by_qid[rec["_id"]], key=lambda r: r["candidate"])
        forward = [f"{S}{h}, {r}, {t}{E}" for h, r, t in rec["evidences"]]
        h, r, t = rec["evidences"][0]
        # Stored docids are marked, in order, with the stored spelling (candidate 1 wrote them sloppily).
        assert cands[0]["docids"] == forward and cands[1]["docids"] == forward
        assert cands[WINNER]["docids"] == [f"{S}{t}, {r}, {h}{E}"] + forward[1:]
        assert cands[WINNER]["flipped"] == [True] + [False] * (len(forward) - 1)
        assert cands[0]["flipped"] == [False] * len(forward)
        for cand in cands:
            for d in cand["docids"]:
                assert d in cand["text"]
            assert not re.search(r"\[[^\]]*,[^\]]*,[^\]]*\]", cand["text"]), cand["text"]
        # The footnote stays a footnote; the made-up triple is marked (the filters stage judges it).
        assert "See [1]." in cands[3]["text"] and cands[3]["docids"][-1] == f"{S}Wikipedia, founded in, 2001{E}"
        # The surest candidate is selected, and it has the lowest score.
        assert [c["selected"] for c in cands] == [i == WINNER for i in range(4)]
        assert cands[WINNER]["score"] == min(c["score"] for c in cands)
        assert cands[WINNER]["score"] < 0.5 * min(c["score"] for c in cands if c["candidate"] != WINNER)
        assert [c["temperature"] for c in cands] == [0.0, 0.7, 0.7, 0.7]
        assert all(c["model"] == "fake-70b" and c["finish_reason"] == "stop" for c in cands)

    cli("validate", out)

    # A re-run resumes: nothing to do, nothing sent. A re-run of a lost part is answered from the cache.
    sent = len(server.posts)
    cli(*args)
    assert len(server.posts) == sent
    (out / "_shards" / "part-00001.json").unlink()
    (out / "part-00001.parquet").unlink()
    cli(*args)
    assert len(server.posts) == sent
    assert read_table(out).num_rows == 4 * chained
    # --overwrite starts the table over but keeps the request cache: everything is re-parsed, nothing re-sent.
    cli(*args, "--overwrite")
    assert len(server.posts) == sent
    key = lambda r: (r["qid"], r["candidate"])  # noqa: E731
    assert sorted(read_table(out).to_pylist(), key=key) == sorted(rows, key=key)
    # Changed parameters are refused rather than mixed in.
    proc = cli(*args[: -len(llm_args(server))], "--candidates", "3", *llm_args(server), check=2)
    assert "candidates" in proc.stderr


def test_select_first_keeps_the_greedy_chain_and_asks_for_no_logprobs(cli, tmp_path, records, server):
    # The corpus is a real ingest output directory; TRIPLES a run directory holding triples/.
    corpus, run = ingest_inputs(cli, tmp_path)
    out = tmp_path / "chains"
    proc = cli("chains", "synthesize", corpus, "--triples", run, "--out", out, "-n", "3", "--select", "first", "--distractors", "3", "--json", *llm_args(server))
    rows = read_table(out).to_pylist()
    assert len(rows) == 3 * len(records)
    summary = json.loads(proc.stdout)  # --json: the summary as one object, nothing else on stdout
    assert summary["rows"] == len(rows) and summary["questions_chained"] == len(records) and summary["complete"]
    assert summary["cache_generated"] == 3 * len(records) and summary["rejected"] == {} and summary["out"] == str(out)
    assert all(r["selected"] == (r["candidate"] == 0) and r["score"] is None for r in rows)
    assert all(r["docids"] and not any(r["flipped"]) for r in rows if r["candidate"] == 0)
    assert not any(r.get("logprobs") for r in server.posts)
    # Distractors: each prompt offers its gold documents' triples (its evidences among them; a document shared with
    # another question holds that question's too) plus three triples of other documents.
    held: dict[str, set[str]] = {}
    for t in read_table(run / "triples").to_pylist():
        held.setdefault(t["doc_id"], set()).add(f"{t['head']}, {t['relation']}, {t['tail']}")
    gold_docs = {q["question"].strip(): q["gold_doc_ids"] for q in read_table(corpus / "questions").to_pylist()}
    for body in server.posts:
        offered = re.findall(r"^\d+\. \[(.*)\]$", body["messages"][-1]["content"], re.M)
        question = re.search(r"^Question: (.*)$", body["messages"][-1]["content"], re.M).group(1)
        gold = [", ".join(e) for e in next(r for r in records if r["question"].strip() == question)["evidences"]]
        of_gold = set().union(*(held[d] for d in gold_docs[question]))
        assert set(gold) <= set(offered) and len(set(offered) - of_gold) == 3 and of_gold <= set(offered)


def test_a_server_without_logprobs_is_a_clear_error_for_entropy(cli, tmp_path, records):
    server = start_server(records, with_logprobs=False)
    try:
        corpus, triples, _ = build_inputs(records[:2], tmp_path, parts=1)
        proc = cli("chains", "synthesize", corpus, "--triples", triples, "--out", tmp_path / "chains", *llm_args(server), check=2)
        assert "logprobs" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        server.close()


@pytest.mark.parametrize("select", ["entropy", "first"])
def test_a_server_answering_only_empty_strings_trips_the_empty_output_guard(cli, tmp_path, records, select):
    server = start_server(records, empty={0, 1, 2, 3})
    try:
        corpus, triples, _ = build_inputs(records, tmp_path, parts=2)
        out = tmp_path / "chains"
        args = ["chains", "synthesize", corpus, "--triples", triples, "--out", out, "-n", "2", "--select", select, *llm_args(server)]
        proc = cli(*args, check=1, env={"COLUMNS": "10000"})
        flat = " ".join(proc.stderr.split())
        n = 2 * len(records[0::2])
        assert f"part-00000: {n} of {n} candidate chains are empty (100% > --max-empty-share 0.2)" in flat, flat
        assert "e.g. " in flat and "candidate 0 (empty output, finish_reason=stop): ''" in flat and "Traceback" not in flat
        # The tripped part is finished and kept; no further part is started.
        manifest = load_manifest(out)
        assert list(manifest.shards) == ["part-00000"] and not manifest.complete
        assert manifest.counters.extra["candidates_empty"] == n
        sent = len(server.posts)
        assert sent == n
        # Re-running does not turn the tripped part into a clean exit, nor generate the other part.
        again = cli(*args, check=1, env={"COLUMNS": "10000"})
        assert "finished by an earlier run" in " ".join(again.stderr.split()) and len(server.posts) == sent
        # A relaxed threshold lets the run finish; the empty chains are kept, counted, and all selected
        # only because nothing else exists.
        cli(*args, "--max-empty-share", "1")
        assert load_manifest(out).complete
    finally:
        server.close()


def test_an_empty_candidate_is_never_selected_over_a_non_empty_one(cli, tmp_path, records):
    # The greedy candidate (the one `first` keeps, and the fallback of `entropy`) and the surest one are empty.
    server = start_server(records, empty={0, WINNER})
    try:
        corpus, triples, _ = build_inputs(records, tmp_path, parts=1)
        for select in ("entropy", "first"):
            out = tmp_path / select
            cli("chains", "synthesize", corpus, "--triples", triples, "--out", out, "-n", "4", "--select", select, "--max-empty-share", "0.5", *llm_args(server))
            rows = read_table(out).to_pylist()
            selected = [r for r in rows if r["selected"]]
            assert len(selected) == len(records) and all(r["text"] and r["candidate"] in (1, 3) for r in selected), select
            assert load_manifest(out).counters.extra["candidates_empty"] == 2 * len(records)
    finally:
        server.close()


def test_questions_from_stdin_and_chains_to_stdout(cli, tmp_path, records, server):
    # `corpus ingest --out -` streams documents and questions; chains reads the questions from that stream.
    _, run = ingest_inputs(cli, tmp_path)
    stream = cli("corpus", "ingest", TWO_WIKI, "--out", "-").stdout
    proc = cli("chains", "synthesize", "-", "--triples", run, "--out", "-", "-n", "2", *llm_args(server), "--cache-dir", tmp_path / "cache", input=stream)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 2 * len(records) and sum(r["selected"] for r in rows) == len(records)
    assert all(d.startswith(S) and d.endswith(E) for r in rows for d in r["docids"])
    assert {r["qid"] for r in rows} == {r["_id"] for r in records}


def test_a_stage_made_from_stdin_is_never_resumed_with_other_rows(cli, tmp_path):
    """Standard input is one of the stage's recorded inputs: a second run with other rows on stdin is refused
    (before: it resumed, kept the first run's rows and exited 0), and an empty stdin is named as such (before: "its
    input .../triples has no rows")."""
    _, run = ingest_inputs(cli, tmp_path)
    stream = cli("corpus", "ingest", TWO_WIKI, "--out", "-").stdout
    lines = stream.splitlines(keepends=True)
    out = tmp_path / "gold"
    cli("chains", "gold", "-", "--triples", run, "--out", out, input=stream)
    err = cli("chains", "gold", "-", "--triples", run, "--out", out, input="".join(lines[:-1]), check=False).stderr  # one question fewer
    assert "exists from a run that read standard input, which cannot be resumed" in " ".join(err.split()), err
    err = cli("chains", "gold", "-", "--triples", run, "--out", tmp_path / "empty", input="", check=1).stderr
    assert "no rows written: its input standard input has no rows" in " ".join(err.split()), err


def _rewrite_questions(corpus: Path, changes: dict[str, dict]) -> None:
    """Edit questions in place in their shards (keeps shard records consistent by rewriting the stage)."""
    qdir = corpus / "questions"
    parts = sorted(qdir.glob("part-*.parquet"))
    tables = [pq.read_table(p).to_pylist() for p in parts]
    w = StageWriter(qdir, StageSpec("questions", QUESTIONS), overwrite=True, num_parts=len(parts))
    for i, rows in enumerate(tables):
        with w.shard(i) as sh:
            rows = [{**r, **changes.get(r["qid"], {})} for r in rows]
            sh.count_in(len(rows))
            sh.write_rows(rows)
    w.finish()


def _drop_triples(triples: Path, doc_ids: set[str]) -> None:
    rows = [r for r in read_table(triples).to_pylist() if r["doc_id"] not in doc_ids]
    w = StageWriter(triples, StageSpec("triples", TRIPLES), overwrite=True, num_parts=1)
    with w.shard(0) as sh:
        sh.count_in(len(rows))
        sh.write_rows(rows)
    w.finish()


@pytest.mark.slow
def test_tiny_model_end_to_end_with_entropy_selection(cli, tmp_path, records):
    """Real generation with the embedded SmolLM2-135M through the transformers backend, logprobs from its scores."""
    corpus, triples, _ = build_inputs(records[:2], tmp_path, parts=1)
    (tmp_path / "zero_shot.jsonl").write_text("")  # a short prompt keeps the CPU run quick
    out = tmp_path / "chains"
    args = ["chains", "synthesize", corpus, "--triples", triples, "--out", out, "-n", "2", "--max-tokens", "32", "--few-shot", tmp_path / "zero_shot.jsonl"]
    cli(*args)
    rows = read_table(out).to_pylist()
    assert len(rows) == 4
    assert {r["model"] for r in rows} == {"SmolLM2-135M-Instruct"}
    for qid in {r["qid"] for r in rows}:
        cands = sorted((r for r in rows if r["qid"] == qid), key=lambda r: r["candidate"])
        assert [c["temperature"] for c in cands] == [0.0, 0.7]
        assert sum(c["selected"] for c in cands) == 1
        scored = [c for c in cands if c["score"] is not None]
        assert scored, "a chain of real words gets an entropy score"
        assert all(0.0 <= c["score"] <= math.log(5) + 1e-9 for c in scored)  # top-5 entropy is at most ln 5
        chosen = next(c for c in cands if c["selected"])
        assert chosen["score"] == min(c["score"] for c in scored)
        for c in cands:
            assert c["text"].count(S) == len(c["docids"]) == len(c["flipped"])
    cli("validate", out)
    # The part is lost; the re-run answers every request from the cache.
    (out / "_shards" / "part-00000.json").unlink()
    proc = cli(*args)
    assert "4 hits, 0 generated" in " ".join(proc.stderr.split())
    assert read_table(out).to_pylist() == rows


def test_batch_boundaries_keep_every_question_and_reject_positions(tmp_path, records, server, monkeypatch):
    """In-process run with tiny lookup and generation batches: the rows and reject positions do not depend on them."""
    from grtool.chains import synthesize as stage
    from grtool.chains.prompt import ChainPrompt
    from grtool.llm import make_backend

    corpus, triples, _ = build_inputs(records, tmp_path, parts=1)
    _rewrite_questions(corpus, {records[4]["_id"]: {"gold_doc_ids": []}, records[9]["_id"]: {"answerable": False}})
    settings = stage.ChainSettings(candidates=2)
    run = dict(backend_name="openai", model_name="fake-70b", cache_dir=tmp_path / "cache")

    def backend():
        return make_backend("openai", "fake-70b", base_url=server.url, max_retries=0)

    big, _ = stage.synthesize(str(corpus), str(triples), str(tmp_path / "big"), backend, settings, ChainPrompt.load(), **run)
    monkeypatch.setattr(stage, "QUESTION_BATCH", 3)
    monkeypatch.setattr(stage, "GENERATE_BATCH", 2)
    small, stats = stage.synthesize(str(corpus), str(triples), str(tmp_path / "small"), backend, settings, ChainPrompt.load(), **run)
    assert stats.misses == 0  # same requests, all from the cache

    def without_cache(c):
        return msgspec.structs.replace(c, extra={k: v for k, v in c.extra.items() if not k.startswith("cache_")})

    assert without_cache(small.counters) == without_cache(big.counters)
    assert small.counters.out == 2 * (len(records) - 2)
    assert read_table(tmp_path / "small").to_pylist() == read_table(tmp_path / "big").to_pylist()
    rejects = [json.loads(line) for line in (tmp_path / "small" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
    assert sorted(r["position"] for r in rejects) == [4, 9]
    assert {r["reason"] for r in rejects} == {"no gold documents", "unanswerable without context documents"}
