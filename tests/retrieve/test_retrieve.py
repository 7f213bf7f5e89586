"""`grtool retrieve` with the real embedded model (SmolLM2-135M on the CPU) over a real FM-index.

The corpus is the ingest of the samples corpus (our own 2WikiMultihopQA and MuSiQue records) with the triples of
``sample_helpers.build_samples`` (2Wiki's evidence triples). Every docid generated under the constraint must exist
in the index, in both marker modes; the responses directory feeds `eval recall` and `export kto` unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli

from grtool.vocab.readers import DocidIndex
from grtool.store.records import load_manifest
from grtool.store.stage import read_table
from imports_helpers import without_torch
from retrieve_helpers import assert_all_exist, build_indexed_samples, table_rows

pytestmark = pytest.mark.slow

FAST = ("--max-tokens", "48", "--threads", "2")  # room for a docid or two: what the checks below need
# The samples are all dev questions: answer the MuSiQue ones, with worked examples from the (other) dev questions.
FEW_SHOT_FROM_2WIKI = ("--dataset", "musique", "--few-shot-from", "dev")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_indexed_samples(tmp_path_factory.mktemp("retrieve") / "run")


@pytest.fixture(scope="module")
def marker_model(tmp_path_factory):
    """The embedded model with the two docid markers added to its tokenizer, their embeddings taken from the
    tokens ``[`` and ``]`` (slightly scaled, so the marker wins where the model would open a bracket): a stand-in
    for a model trained with the markers (`grtool train sft` adds them the same way)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grtool.docid import DOCID_END, DOCID_START
    from grtool.models import resolve_model

    base = resolve_model(None).path
    out = tmp_path_factory.mktemp("marker_model")
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": [DOCID_START, DOCID_END]})
    model.resize_token_embeddings(len(tok))
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        for marker, like in ((DOCID_START, "["), (DOCID_END, "]")):
            emb[tok.convert_tokens_to_ids(marker)] = emb[tok.convert_tokens_to_ids(tok.tokenize(like)[0])] * 1.2
    model.save_pretrained(out)
    tok.save_pretrained(out)
    yield out
    shutil.rmtree(out, ignore_errors=True)  # 0.5 GB of weights: gone with the module, not at the session's end


def test_brackets_few_shot_docids_exist_and_feed_recall_and_kto(run, tmp_path):
    out = tmp_path / "responses"
    # the worked examples are 2Wiki dev questions, never one of the MuSiQue questions answered
    proc = run_cli("retrieve", run, "--index", run / "index", "--markers", "brackets", "--few-shot", "2", *FEW_SHOT_FROM_2WIKI, "--out", out, *FAST, "--json")
    report = json.loads(proc.stdout)
    rows = table_rows(out)
    questions = [q for q in read_table(run / "questions").to_pylist() if q["dataset"] == "musique"]
    shown = load_manifest(out).params["few_shot_from"]
    assert shown["split"] == "dev" and len(shown["qids"]) == 2 and not set(shown["qids"]) & {q["qid"] for q in questions}
    assert len(rows) == len(questions) == report["responses"]
    lookup = DocidIndex.build(run / "triples")
    docids = assert_all_exist(rows, lookup)
    assert docids > 0 and report["docids"] == docids
    assert report["hallucinated"] == 0
    assert {r["markers"] for r in rows} == {"brackets"} and {r["mode"] for r in rows} == {"docids"}
    assert all(r["latency_ms"] > 0 and r["tokens"] > 0 for r in rows)
    # the summary's recall is `eval recall` on the directory
    recall = json.loads(run_cli("eval", "recall", out, "--corpus", run, "--triples", run / "triples", "--json").stdout)
    assert report["recall"]["recall"] == recall["recall"] and report["recall"]["responses"] == recall["responses"] > 0
    kto = run_cli("export", "kto", out, "--corpus", run, "--triples", run / "triples", "--out", tmp_path / "kto.json", "--json", check=False)
    if kto.returncode == 1:  # the tiny model's few-shot answers hit no gold set exactly: KTO would get one class
        assert "no desirable responses" in kto.stderr and recall["exact_match_share"] == 0, kto.stderr
    else:
        counts = json.loads(kto.stdout)
        assert counts["desirable"] + counts["undesirable"] + counts["dropped"] == recall["responses"]


def test_special_markers_docids_exist(run, marker_model, tmp_path):
    index = tmp_path / "index"
    run_cli("index", "build", run / "triples", "--tokenizer", marker_model, "--flips", "--out", index)
    out = tmp_path / "responses"
    proc = run_cli(
        "retrieve", run, "--index", index, "--model", marker_model, "--few-shot", "2", *FEW_SHOT_FROM_2WIKI, "--out", out, *FAST, "--json",
    )  # fmt: skip
    report = json.loads(proc.stdout)
    rows = table_rows(out)
    docids = assert_all_exist(rows, DocidIndex.build(run / "triples"))
    assert docids > 0 and report["hallucinated"] == 0
    assert all(d.startswith("<docid_start>") and d.endswith("<docid_end>") for r in rows for d in r["docids"])


def test_samples_are_reproducible_and_pipe_into_eval(run, tmp_path):
    args = ("retrieve", run, "--index", run / "index", "--markers", "brackets", "--few-shot", "0", "--limit", "2",
            "--samples", "2", "--temperature", "1.0", "--max-tokens", "16", "--no-cache")  # fmt: skip
    run_cli(*args, "--out", tmp_path / "a")
    a = sorted(table_rows(tmp_path / "a"), key=lambda r: (r["qid"], r["sample"]))
    assert len(a) == 4 and {r["sample"] for r in a} == {0, 1}
    run_cli("validate", tmp_path / "a")  # 2 questions in, 4 rows out: the accounting counts (question, sample)
    assert len({r["text"] for r in a if r["qid"] == a[0]["qid"]}) > 1  # sampled, not two greedy copies
    stdout = run_cli(*args, "--out", "-").stdout
    b = sorted((json.loads(line) for line in stdout.splitlines()), key=lambda r: (r["qid"], r["sample"]))
    assert [r["text"] for r in a] == [r["text"] for r in b]
    piped = run_cli("eval", "recall", "-", "--corpus", run, "--triples", run / "triples", "--json", input=stdout)
    assert json.loads(piped.stdout)["responses"] == 4


def test_killed_run_resumes_with_identical_rows(run, tmp_path):
    args = ("retrieve", run, "--index", run / "index", "--markers", "brackets", "--few-shot", "0", "--limit", "2", "--max-tokens", "16")
    run_cli(*args, "--out", tmp_path / "whole")
    whole = table_rows(tmp_path / "whole")
    # a run that died after its part: delete the manifest's record of completion by removing the part
    partial = tmp_path / "partial"
    shutil.copytree(tmp_path / "whole", partial)
    for f in partial.glob("part-*.parquet"):
        f.unlink()
    proc = run_cli(*args, "--out", partial)
    assert table_rows(partial) == whole, proc.stderr
    assert load_manifest(partial).complete


def test_flipped_docids_decode_with_flips(run):
    """A docid written tail-first is an index sequence with --flips: the constraint lets it through."""
    from grtool.index.base import Index
    from grtool.index.constraints import constraint_from_spec
    from grtool.index.tokenizer import load_tokenizer
    from grtool.retrieve.stage import constraint_spec

    index = Index.open(run / "index")
    tok = load_tokenizer("default").tokenizer
    constraint = constraint_from_spec(constraint_spec(index, "brackets", None), tok)
    triple = read_table(run / "triples").to_pylist()[0]
    flipped = f"[{triple['tail']}, {triple['relation']}, {triple['head']}]"
    state = constraint.initial([])
    for t in tok.encode(flipped, add_special_tokens=False).ids:
        allowed = constraint.allowed(state)
        assert t in allowed if not hasattr(allowed, "ids") else t not in allowed.ids, flipped
        state = constraint.advance(state, t)
    assert constraint.is_free(state)


def test_bad_input_exits_2(run, tmp_path):
    """The first three are refused before torch is imported (it takes seconds): there, a torch that exits 99 when
    imported stands first on the path. The embedded model's converted copy was checked once before (remembered)."""
    from grtool.models import resolve_model

    resolve_model(None)  # converted and checked (remembered) here, not by the refusals below
    no_torch = without_torch(tmp_path / "poisoned")
    base = ("retrieve", run, "--index", run / "index", "--out", tmp_path / "x", "--markers", "brackets")
    proc = run_cli(*base, "--dataset", "nosuch", check=2, env=no_torch)
    assert "no questions selected" in proc.stderr
    proc = run_cli(*base, "--mode", "gmr", check=2, env=no_torch)
    assert "--source documents" in proc.stderr
    proc = run_cli(*base, "--adapter", tmp_path / "missing", check=2, env=no_torch)
    assert "--adapter" in proc.stderr
    llama = tmp_path / "llama_index"
    run_cli("index", "build", run / "triples", "--tokenizer", "llama3", "--out", llama)
    proc = run_cli("retrieve", run, "--index", llama, "--out", tmp_path / "y", check=2)
    assert "--tokenizer" in proc.stderr and "llama3" in proc.stderr


def test_max_docids_forbids_opening_another(run):
    """After --max-docids complete docids no token that would open one is allowed; inside a docid nothing changes."""
    from grtool.index.base import Index
    from grtool.index.constraints import constraint_from_spec
    from grtool.index.decoding import Forbidden
    from grtool.index.tokenizer import load_tokenizer
    from grtool.retrieve.stage import constraint_spec

    index = Index.open(run / "index")
    tok = load_tokenizer("default").tokenizer
    limited = constraint_from_spec(constraint_spec(index, "brackets", 1), tok)
    triple = read_table(run / "triples").to_pylist()[0]
    state = limited.initial([])
    assert not set(limited.openers) <= set(limited.allowed(state).ids)  # before: a docid may open
    for t in tok.encode(f"See [{triple['head']}, {triple['relation']}, {triple['tail']}]", add_special_tokens=False).ids:
        state = limited.advance(state, t)
    after = limited.allowed(state)
    assert isinstance(after, Forbidden) and set(limited.openers) <= set(after.ids)


def test_a_question_beyond_the_context_is_a_too_long_reject(run, tmp_path):
    """A prompt over the model's context is never generated: a reject (reason too_long) per sample, counted, the
    accounting kept (in = out + rejected), the summary saying how many; the other questions are answered."""
    from sample_helpers import write_stage

    from grtool.store.schemas import QUESTIONS

    rows = read_table(run / "questions").to_pylist()[:3]
    long_qid = rows[1]["qid"]
    rows[1]["question"] = "Which of these came first? " + "a long list of names, " * 2300  # ~50K characters
    write_stage(tmp_path / "corpus" / "questions", "questions", QUESTIONS, rows)
    out = tmp_path / "responses"
    proc = run_cli(
        "retrieve", tmp_path / "corpus", "--index", run / "index", "--triples", run / "triples", "--markers", "brackets",
        "--few-shot", "0", "--samples", "2", "--max-tokens", "4", "--threads", "2", "--no-cache", "--out", out,
    )  # fmt: skip
    assert "1 question(s) not answered" in " ".join((proc.stdout + proc.stderr).split()), proc.stderr
    responses = table_rows(out)
    assert sorted((r["qid"], r["sample"]) for r in responses) == sorted((r["qid"], s) for r in rows if r["qid"] != long_qid for s in (0, 1))
    counters = load_manifest(out).counters
    assert counters.in_ == 6 and counters.out == 4 and counters.rejected == {"too_long": 2}, counters
    assert counters.extra["questions_too_long"] == 1
    rejects = [json.loads(line) for f in sorted((out / "_rejects").iterdir()) for line in f.read_text().splitlines()]
    assert [(r["reason"], r["record"]["qid"]) for r in rejects] == [("too_long", long_qid)] * 2
    run_cli("validate", out)


def test_every_question_beyond_the_context_fails_naming_the_reason(run, tmp_path):
    """All prompts too long: nothing was generated, so the run fails saying why (before: exit 0, 0 responses, and
    "no selected question has gold documents")."""
    from sample_helpers import write_stage

    from grtool.store.schemas import QUESTIONS

    rows = read_table(run / "questions").to_pylist()[:2]
    for row in rows:
        row["question"] = "Which of these came first? " + "a long list of names, " * 2300
    write_stage(tmp_path / "corpus" / "questions", "questions", QUESTIONS, rows)
    proc = run_cli(
        "retrieve", tmp_path / "corpus", "--index", run / "index", "--triples", run / "triples", "--markers", "brackets",
        "--few-shot", "0", "--max-tokens", "4", "--threads", "2", "--no-cache", "--out", tmp_path / "responses", check=1,
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "'too_long' ×2" in err and "longer than the model's context" in err, err[-2000:]


def test_a_model_that_writes_only_end_of_text_trips_the_empty_guard(run, tmp_path):
    """A model with non-finite weights (what a diverged training run saved, before runs stopped on it) writes
    end-of-text only: its answers count as empty and the run fails, exit 1 (the end-of-text tokens a decoding that
    keeps special tokens leaves in the text count too: test_retrieve_settings.py)."""
    from checkpoint_records import nan_model
    from grtool.models import resolve_model

    broken = nan_model(tmp_path / "nan-model", Path(resolve_model(None).path))  # the embedded model writes text: only the NaN empties it
    proc = run_cli(
        "retrieve", run, "--index", run / "index", "--triples", run / "triples", "--model", broken, "--markers", "brackets", "--few-shot", "0",
        "--limit", "3", "--max-tokens", "6", "--threads", "2", "--no-cache", "--out", tmp_path / "responses", check=1,
    )  # fmt: skip
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "are empty" in err, err[-2000:]
