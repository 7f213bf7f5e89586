"""`grtool triples extract` end to end with the embedded model (transformers backend, real generation), and its
empty-document guard against a real OpenAI-compatible server whose answers mostly hold no triple."""

from __future__ import annotations

import json

import pytest

from grtool.llm import Sampling, make_backend
from grtool.llm.cache import CachedLLM
from grtool.store.stage import read_table
from llm_helpers import hotpot_paragraphs, write_documents
from log_helpers import check_log
from llm_helpers import FlakyServer, serve
from llm_helpers import GUARD_ANSWERS


@pytest.mark.slow
def test_transformers_extract_end_to_end(tmp_path, cli):
    docs = hotpot_paragraphs(3)
    docs.append({"doc_id": "empty-doc", "title": "Nothing", "text": "   ", "datasets": ["hotpotqa"]})
    write_documents(tmp_path / "corpus" / "documents", docs, num_parts=2)
    out = tmp_path / "out"
    args = ("triples", "extract", tmp_path / "corpus", "--out", out, "--max-tokens", "48", "--batch-size", "2", "--max-empty-share", "1")
    proc = cli(*args, env={"GRTOOL_PROGRESS_INTERVAL": "1"})
    assert "triples:" in proc.stderr
    # The log (stderr is a pipe here, as under Slurm): stamped lines, no bar frames, a progress line only on news,
    # and it says what is happening while no document is done yet.
    log = check_log(proc.stderr, progress=("triples extract",))
    assert any(line.startswith("triples extract: 0/4 (0%)") and "; generating batch 1/1 (2 prompts)" in line for line in log), proc.stderr

    manifest = json.loads((out / "triples" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["model"] == "SmolLM2-135M-Instruct"
    assert manifest["params"]["sampling"]["max_tokens"] == 48 and manifest["params"]["sampling"]["json_schema"] is None
    extra = manifest["counters"]["extra"]
    assert extra["documents"] == 3 and extra["cache_misses"] == 3 and extra["completion_tokens"] > 0
    assert manifest["counters"]["rejected"].get("empty_text") == 1

    calls = read_table(out / "llm_calls").to_pylist()
    assert sorted(c["row_key"] for c in calls) == sorted(d["doc_id"] for d in docs[:3])
    assert all(c["completion_tokens"] <= 48 and c["output"] for c in calls)
    # The tiny model writes JSON in the few-shot's shape; 48 tokens cut it off, the parser keeps complete triples.
    triples = read_table(out / "triples")
    assert triples.num_rows > 0
    assert all(d.startswith("<docid_start>") and d.endswith("<docid_end>") for d in triples["docid"].to_pylist())
    cli("validate", out / "triples")
    cli("validate", out / "llm_calls")

    # Resume: nothing left to do, the model is not even loaded.
    again = cli(*args)
    assert "2 already done" in again.stderr

    # A stricter guard on the same outputs (served from the cache) trips when documents give nothing.
    if extra["documents_without_triples"]:
        cli(*args, "--max-empty-share", "0", "--overwrite", check=1)


@pytest.mark.slow
def test_transformers_backend_logprobs_stop_and_cache(tmp_path):
    backend = make_backend("transformers", batch_size=2)
    llm = CachedLLM(backend, tmp_path / "cache.sqlite")
    prompts = [[{"role": "user", "content": "Count from one to ten in words."}], [{"role": "user", "content": "Say hello."}]]
    sampling = Sampling(max_tokens=6, logprobs=3)
    gens = llm.generate(prompts, sampling)
    assert [g.cached for g in gens] == [False, False] and llm.stats.misses == 2
    for g in gens:
        assert g.finish_reason in ("stop", "length") and 0 < g.completion_tokens <= 6
        assert len(g.logprobs) == g.completion_tokens
        assert all(len(t.top) <= 3 and t.logprob <= 0 and t.logprob <= max(t.top.values()) + 1e-5 for t in g.logprobs)
    # Greedy generation in batches equals generation one by one (left padding is handled).
    single = backend.generate([prompts[0]], sampling)[0]
    assert single.text == gens[0].text
    again = llm.generate(prompts, sampling)
    assert [g.cached for g in again] == [True, True] and [g.text for g in again] == [g.text for g in gens]
    assert again[0].logprobs[0].token == gens[0].logprobs[0].token
    # max_tokens is part of the key: a different limit is a miss.
    llm.generate(prompts[:1], Sampling(max_tokens=5))
    assert llm.stats.misses == 3
    stopped = backend.generate([prompts[0]], Sampling(max_tokens=20, stop=("3.",)))[0]
    assert "3." not in stopped.text and stopped.finish_reason == "stop"


def test_empty_document_guard_trips_and_stays_tripped_on_resume(tmp_path, cli):
    docs = hotpot_paragraphs(len(GUARD_ANSWERS))
    documents = write_documents(tmp_path / "corpus" / "documents", docs)
    server = FlakyServer({d["title"]: (a[0], a[1]) for d, a in zip(docs, GUARD_ANSWERS)}, flaky=False)
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", documents, "--out", out, "--backend", "openai", "--base-url", server.url)
    env = {"COLUMNS": "10000"}  # one line per message: no wrapping inside what is asserted
    empty = [d["doc_id"] for d, a in zip(docs, GUARD_ANSWERS) if a[2] is not None]
    guard = "part-00000: 4 of 5 documents gave no triples (80% > --max-empty-share 0.2)"
    try:
        first = cli(*args, check=1, env=env)
        assert guard in first.stderr and "_rejects" in first.stderr and "earlier run" not in first.stderr
        assert f"{empty[0]} (no readable triple, finish_reason=stop)" in first.stderr
        rejects = [json.loads(line) for line in (out / "triples" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
        no_triples = [(r["record"]["doc_id"], r["detail"]) for r in rejects if r["reason"] == "no_triples"]
        assert sorted(no_triples) == sorted((d["doc_id"], a[2]) for d, a in zip(docs, GUARD_ANSWERS) if a[2] is not None)
        assert len(server.posts) == len(docs)

        # The same command again: the part is done, nothing is sent, and the guard still trips from the record.
        again = cli(*args, check=1, env=env)
        assert guard in again.stderr and "finished by an earlier run" in again.stderr
        assert f"{empty[0]} (no readable triple, finish_reason=stop)" in again.stderr
        assert f"{empty[2]} (truncated before the first triple, finish_reason=length)" in again.stderr
        assert len(server.posts) == len(docs)

        # The guard is not part of the stage's identity: a looser one accepts the finished part as it is.
        cli(*args, "--max-empty-share", "0.8", env=env)
        assert len(server.posts) == len(docs)
    finally:
        server.shutdown()


def test_extract_drops_self_loops_example_copies_and_ungrounded_triples(tmp_path, examples, cli):
    """Real MoreHopQA paragraphs, canned answers holding the issue's bad triples: they go to _rejects with their
    reason, the counts balance, and the summary and --json give the shares."""
    wanted = {"Jaws (film)", "Steven Spielberg"}
    docs = {}
    for rec in json.loads((examples / "morehopqa" / "morehopqa_final.example.json").read_text()):
        for title, sentences in rec["context"]:
            if title in wanted:
                docs[title] = {"doc_id": title.split()[0].lower(), "title": title, "text": "".join(sentences), "datasets": ["morehopqa"]}
    answers = {
        "Jaws (film)": json.dumps({"triples": [
            ["Jaws", "was directed by", "Steven Spielberg"],  # kept
            ["Jaws", "is based on", "1974 novel by Peter Benchley"],  # kept
            ["Jaws", "lives in", "Aberystwyth"],  # prompt_example
            ["a clockmaker", "lives in", "Aberystwyth"],  # prompt_example, verbatim
            ["Jaws", "is a", "shark film"],  # ungrounded under strict, kept under loose
        ]}),
        "Steven Spielberg": json.dumps({"triples": [
            ["Steven Spielberg", "associated with", "Steven Spielberg"],  # self_loop
            ["Steven Spielberg", "was born in", "Cincinnati, Ohio"],  # kept
            ["Dodoma", "is the national capital of", "Djibouti"],  # ungrounded
        ]}),
    }  # fmt: skip
    documents = write_documents(tmp_path / "corpus" / "documents", list(docs.values()))
    server = FlakyServer({t: (a, "stop") for t, a in answers.items()}, flaky=False)
    serve(server)
    out = tmp_path / "out"
    args = ("triples", "extract", documents, "--out", out, "--backend", "openai", "--base-url", server.url, "--json")
    try:
        proc = cli(*args, env={"COLUMNS": "10000"})
        assert "dropped (strict grounding): self_loop 1 (12.5%), prompt_example 2 (25.0%), ungrounded 2 (25.0%)" in proc.stderr
        report = json.loads(proc.stdout)
        assert report["dropped"]["ungrounded"] == {"dropped": 2, "share": 0.25} and report["grounding"] == "strict"
        kept = read_table(out / "triples").to_pylist()
        assert sorted((r["head"], r["tail"]) for r in kept) == [
            ("Jaws", "1974 novel by Peter Benchley"), ("Jaws", "Steven Spielberg"), ("Steven Spielberg", "Cincinnati, Ohio")
        ]  # fmt: skip
        assert sorted(r["idx"] for r in kept if r["doc_id"] == "jaws") == [0, 1]
        rejects = [json.loads(line) for line in (out / "triples" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
        by_reason = sorted((r["reason"], r["record"]["head"], r["record"]["tail"]) for r in rejects)
        assert by_reason == [
            ("prompt_example", "Jaws", "Aberystwyth"), ("prompt_example", "a clockmaker", "Aberystwyth"),
            ("self_loop", "Steven Spielberg", "Steven Spielberg"),
            ("ungrounded", "Dodoma", "Djibouti"), ("ungrounded", "Jaws", "shark film"),
        ]  # fmt: skip
        counters = json.loads((out / "triples" / "_manifest.json").read_text())["counters"]
        assert counters["in"] == 8 == counters["out"] + counters["merged"] + sum(counters["rejected"].values())
        cli("validate", out / "triples")
        collisions = json.loads(cli("triples", "collisions", out, "--json").stdout)
        assert collisions["dropped"]["prompt_example"] == {"dropped": 2, "share": 0.25}

        # Loose keeps "shark film" (half its words); a different mode is a different stage: --overwrite re-parses
        # the cached answers without sending anything.
        loose = cli(*args, "--grounding", "loose", "--overwrite", env={"COLUMNS": "10000"})
        assert json.loads(loose.stdout)["dropped"]["ungrounded"]["dropped"] == 1
        assert len(server.posts) == 2
    finally:
        server.shutdown()
