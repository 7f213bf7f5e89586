"""Splits end to end (#35): every stage that reads questions takes `--split`, records it, and refuses a split
no question has; exports and checkpoints record the questions they hold; `eval recall` refuses to score
questions the model trained on; the demo trains on train questions and scores dev and test ones only.

The corpus is the real 2WikiMultihopQA sample, its records cut into a dev file and a train file (release
names decide the split), with the dataset's own evidence triples as the triples stage.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import orjson
import pytest

from grtool.store.schemas import CHAINS, TRIPLES
from grtool.store.records import load_manifest
from grtool.store.stage import read_table
from checkpoint_records import checkpoint_record, checkpoint_record_bytes
from conftest import REPO, run_cli
from sample_helpers import write_stage
from chains_helpers import load_2wiki

TRAIN_RECORDS = 4  # the last records of the sample become the train file
QUESTION_STAGES = ("chains synthesize", "chains gold", "filters apply", "export sft", "export kto", "export gmr", "retrieve")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """The tests' 2Wiki records as a dev file and a train file, ingested, with its evidence triples and gold chains."""
    from grtool.triples.evidence import write_evidence_stage

    root = tmp_path_factory.mktemp("splits")
    records = load_2wiki()
    (root / "in").mkdir()
    (root / "in" / "data_ids_dev.json").write_text(json.dumps(records[:-TRAIN_RECORDS]))
    (root / "in" / "data_ids_train.json").write_text(json.dumps(records[-TRAIN_RECORDS:]))
    run_cli("corpus", "ingest", root / "in", "--out", root / "corpus")
    assert write_evidence_stage(root / "corpus", root / "triples") > 0
    run_cli("chains", "gold", root / "corpus", "--triples", root / "triples", "--out", root / "chains")  # every question
    return root


def split_of(run: Path) -> dict[str, str]:
    return {q["qid"]: q["split"] for q in read_table(run / "corpus" / "questions").to_pylist()}


def qids_of(run: Path, *splits: str) -> set[str]:
    return {q for q, s in split_of(run).items() if s in splits}


def sidecar(path: Path) -> dict:
    return orjson.loads(path.with_name(path.name + ".grtool.json").read_bytes())


def test_ingest_shows_each_input_split_and_warns_of_an_unknown_one(cli, tmp_path, examples):
    nameless = tmp_path / "hotpot_sample.json"  # no train/dev/test in the name, no --split
    shutil.copy(examples / "hotpotqa" / "hotpot_train_v1.1.example.json", nameless)
    proc = cli("corpus", "ingest", examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", nameless, "--out", tmp_path / "corpus", "--json")
    splits = {Path(e["path"]).name: e["split"] for e in json.loads(proc.stdout)["detected"]}
    assert splits == {"hotpot_dev_distractor_v1.example.json": "dev", "hotpot_sample.json": "unknown"}
    warnings = [line for line in proc.stderr.splitlines() if "no split" in line]
    assert len(warnings) == 1 and str(nameless) in warnings[0]
    table = cli("corpus", "ingest", examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", nameless, "--out", tmp_path / "corpus").stderr
    assert "split" in table and "unknown" in table  # the summary of the resumed run shows the splits too


def test_chains_gold_reads_only_its_split_and_records_it(cli, run, tmp_path):
    out = tmp_path / "chains"
    summary = json.loads(cli("chains", "gold", run / "corpus", "--triples", run / "triples", "--out", out, "--split", "train", "--json").stdout)
    rows = read_table(out).to_pylist()
    train = qids_of(run, "train")
    assert rows and {r["qid"] for r in rows} <= train
    assert summary["questions"] == len(train)
    manifest = load_manifest(out)
    assert manifest.params["split"] == ["train"]
    assert manifest.counters.extra["questions_not_selected"] == len(qids_of(run, "dev"))
    # a resume with another selection is another run: refused like any changed option
    proc = cli("chains", "gold", run / "corpus", "--triples", run / "triples", "--out", out, "--split", "dev", check=2)
    assert "split" in proc.stderr


def test_an_unknown_split_is_a_usage_error_naming_the_splits_there(cli, run, tmp_path):
    commands = [
        ("chains", "gold", run / "corpus", "--triples", run / "triples", "--out", tmp_path / "c"),
        ("filters", "apply", run / "chains", "--corpus", run / "corpus", "--triples", run / "triples", "--out", tmp_path / "f"),
        ("export", "sft", run / "chains", "--corpus", run / "corpus", "--out", tmp_path / "sft.json"),
        ("export", "gmr", run / "corpus", "--out", tmp_path / "gmr.jsonl"),
    ]
    for command in commands:
        err = cli(*command, "--split", "holdout", check=2).stderr
        assert "--split holdout" in err and "dev (11 questions)" in err and "train (4 questions)" in err, err
        assert not (tmp_path / "c").exists() and not (tmp_path / "f").exists() and not (tmp_path / "sft.json").exists()
    # another name of a split ingest normalised selects it, said once (before: refused, "it holds dev")
    err = cli("export", "gmr", run / "corpus", "--out", tmp_path / "gmr.jsonl", "--split", "Validation", "--json").stderr
    assert "--split 'Validation' is read as 'dev'" in err, err


def test_filters_and_exports_read_only_their_split_and_record_the_questions(cli, run, tmp_path):
    dev, train = qids_of(run, "dev"), qids_of(run, "train")
    chains = read_table(run / "chains").to_pylist()
    chained_train = {r["qid"] for r in chains} & train
    assert chained_train and {r["qid"] for r in chains} & dev  # the input holds chains of both splits

    report = json.loads(cli("filters", "apply", run / "chains", "--corpus", run / "corpus", "--triples", run / "triples",
                            "--out", tmp_path / "filtered", "--split", "train", "--json").stdout)  # fmt: skip
    kept = read_table(tmp_path / "filtered").to_pylist()
    assert {r["qid"] for r in kept} == chained_train
    assert report["not_selected"] == sum(r["qid"] in dev for r in chains) and report["questions"] == len(chained_train)
    assert load_manifest(tmp_path / "filtered").params["split"] == ["train"]

    # export sft of the unfiltered chains: --split alone keeps the dev questions out
    sft = tmp_path / "sft.json"
    result = json.loads(cli("export", "sft", run / "chains", "--corpus", run / "corpus", "--out", sft, "--split", "train", "--json").stdout)
    record = sidecar(sft)["questions"]
    assert set(record["qids"]) == chained_train and record["count"] == len(chained_train) and record["splits"] == ["train"]
    assert result["outside_split"] == sum(r["qid"] in dev for r in chains) and len(json.loads(sft.read_text())) == len(chained_train)

    gmr = tmp_path / "gmr.jsonl"
    result = json.loads(cli("export", "gmr", run / "corpus", "--out", gmr, "--split", "dev", "--json").stdout)
    pairs = [json.loads(line) for line in gmr.read_text().splitlines()]
    assert {p["qid"] for p in pairs} <= dev and set(sidecar(gmr)["questions"]["qids"]) == {p["qid"] for p in pairs}
    assert result["outside_split"] == len(train)

    # export kto: responses to every question (the gold chain: desirable; nothing retrieved: undesirable)
    responses = tmp_path / "responses.jsonl"
    lines = [{"qid": r["qid"], "response": r["text"]} for r in chains] + [{"qid": r["qid"], "response": "So the answer is unknown."} for r in chains]
    responses.write_text("".join(json.dumps(line) + "\n" for line in lines))
    kto = tmp_path / "kto.json"
    result = json.loads(cli("export", "kto", responses, "--corpus", run / "corpus", "--triples", run / "triples", "--out", kto, "--split", "train", "--json").stdout)
    assert set(sidecar(kto)["questions"]["qids"]) == chained_train and result["outside_split"] == 2 * sum(r["qid"] in dev for r in chains)
    assert result["desirable"] + result["undesirable"] == 2 * len(chained_train)


def test_chains_synthesize_asks_only_about_its_split(cli, run, tmp_path):
    from chains_helpers import llm_args, load_2wiki, start_server

    records = load_2wiki()
    server = start_server(records)
    try:
        out = tmp_path / "chains"
        cli("chains", "synthesize", run / "corpus", "--triples", run / "triples", "--out", out, "--split", "train", "-n", "1", "--select", "first",
            "--few-shot-corpus", "1", *llm_args(server))  # fmt: skip
    finally:
        server.close()
    train = qids_of(run, "train")
    rows = read_table(out).to_pylist()
    assert rows and {r["qid"] for r in rows} <= train
    asked = {r["question"] for r in records[-TRAIN_RECORDS:]}
    manifest = load_manifest(out)
    assert manifest.params["split"] == ["train"] and manifest.counters.extra["questions"] == len(train)
    assert manifest.counters.extra["questions_not_selected"] == len(qids_of(run, "dev")) and len(asked) == len(train)


def test_training_data_records_its_questions_and_a_kto_checkpoint_adds_its_base(run, tmp_path, cli):
    """What `train` writes into grtool.json: the export's questions, plus the base checkpoint's (KTO after SFT)."""
    from grtool.evaluation.overlap import checkpoint_questions, trained_questions
    from grtool.train.data import load_sft

    sft = tmp_path / "sft.json"
    cli("export", "sft", run / "chains", "--corpus", run / "corpus", "--out", sft, "--split", "train")
    data = load_sft(sft)
    exported = set(sidecar(sft)["questions"]["qids"])
    assert data.questions is not None and set(data.questions["qids"]) == exported and exported <= qids_of(run, "train")
    from_chains = load_sft(run / "chains", corpus=str(run / "corpus"))  # a chains directory: every question it holds
    assert set(from_chains.questions["qids"]) == {r["qid"] for r in read_table(run / "chains").to_pylist()}

    base = tmp_path / "ckpt-sft"
    base.mkdir()
    (base / "grtool.json").write_bytes(checkpoint_record_bytes(questions=trained_questions(str(sft), data.questions, None)))
    kto_data = {"qids": ["kto-only-question"], "count": 1}
    record = trained_questions("kto.json", kto_data, base)
    assert set(record["qids"]) == exported | {"kto-only-question"} and record["complete"]
    assert record["count"] == len(exported) + 1 and checkpoint_questions(base)["count"] == len(exported)
    unknown = trained_questions("hand-made.json", None, base)  # data naming no questions: the record says so
    assert not unknown["complete"] and set(unknown["qids"]) == exported


# ------------------------------------------------------------------ the model: retrieve, train, eval recall


@pytest.fixture(scope="module")
def checkpoint(run, tmp_path_factory, tiny_model) -> tuple[Path, set[str]]:
    """The tiny model (its tokenizer is the embedded model's) in a folder with a grtool.json that records the train
    questions as its training data (as `train sft` writes it from `export sft --split train`); an FM-index with its
    tokenizer."""
    from grtool.evaluation.overlap import trained_questions
    from grtool.train.data import exported_questions

    root = tmp_path_factory.mktemp("ckpt")
    sft = root / "sft.json"
    run_cli("export", "sft", run / "chains", "--corpus", run / "corpus", "--out", sft, "--split", "train")
    ckpt = root / "ckpt"
    ckpt.mkdir()
    for f in tiny_model.iterdir():
        (ckpt / f.name).symlink_to(f)
    questions = trained_questions(str(sft), exported_questions(sft), None)
    record = checkpoint_record(data={"source": str(sft), "format": "llamafactory-sharegpt", "rows": 1}, flips=False, questions=questions)
    (ckpt / "grtool.json").write_bytes(orjson.dumps(record))
    run_cli("index", "build", run / "triples", "--tokenizer", "default", "--flips", "--out", run / "index")
    return ckpt, set(questions["qids"])


# --max-empty-share 1: the tiny model's random weights write blanks, and what is tested is which questions are scored
FAST = ("--markers", "brackets", "--few-shot", "0", "--max-tokens", "24", "--threads", "2", "--limit", "2", "--max-empty-share", "1")


@pytest.mark.slow
def test_eval_recall_refuses_questions_the_checkpoint_trained_on(run, checkpoint, tmp_path, cli):
    ckpt, trained = checkpoint
    scored = tmp_path / "dev"
    cli("retrieve", run / "corpus", "--index", run / "index", "--model", ckpt, "--split", "dev", *FAST, "--out", scored)
    assert load_manifest(scored).params["splits"] == ["dev"]
    assert {r["qid"] for r in read_table(scored).to_pylist()} <= qids_of(run, "dev")
    proc = cli("eval", "recall", scored, "--corpus", run / "corpus", "--triples", run / "triples", "--json")
    overlap = json.loads(proc.stdout)["train_overlap"]
    assert overlap["answered_in_training"] == 0 and overlap["trained_questions"] == len(trained) and overlap["model"] == str(ckpt)
    assert "0 of 2 answered questions were in the training data" in proc.stderr

    seen = tmp_path / "train"
    cli("retrieve", run / "corpus", "--index", run / "index", "--model", ckpt, "--split", "train", *FAST, "--out", seen)
    answered = {r["qid"] for r in read_table(seen).to_pylist()}
    overlapping = answered & trained
    assert overlapping
    err = cli("eval", "recall", seen, "--corpus", run / "corpus", "--triples", run / "triples", check=1).stderr
    assert f"{len(overlapping)} of {len(answered)} answered questions were in the training data" in err and sorted(overlapping)[0] in err
    allowed = json.loads(cli("eval", "recall", seen, "--corpus", run / "corpus", "--triples", run / "triples", "--allow-train-overlap", "--json").stdout)
    assert allowed["train_overlap"]["answered_in_training"] == len(overlapping) and allowed["responses"] > 0

    err = cli("retrieve", run / "corpus", "--index", run / "index", "--model", ckpt, "--split", "tset", *FAST, "--out", tmp_path / "x", check=2).stderr
    assert "--split tset" in err and "dev (11 questions)" in err


@pytest.mark.slow
def test_the_overlap_verdict_is_pinned_and_the_same_on_every_route(run, checkpoint, tmp_path, cli):
    """`retrieve` copies the checkpoint's training questions into its manifest: the checkpoint moved away afterwards
    changes nothing, the run directory holding the stage gives the stage's verdict, and a manifest without the copy
    whose checkpoint is gone fails closed."""
    ckpt, trained = checkpoint
    moved = tmp_path / "ckpt-copy"
    shutil.copytree(ckpt, moved, symlinks=True)
    out = tmp_path / "R" / "responses"
    cli("retrieve", run / "corpus", "--index", run / "index", "--model", moved, "--split", "train", *FAST, "--out", out)
    assert load_manifest(out).params["trained_questions"]["count"] == len(trained)
    shutil.rmtree(moved)
    scoring = ("--corpus", run / "corpus", "--triples", run / "triples")
    answered = {r["qid"] for r in read_table(out).to_pylist()}
    want = f"{len(answered & trained)} of {len(answered)} answered questions were in the training data"
    for responses in (out, out.parent):  # the stage, and the run directory holding it
        assert want in " ".join(cli("eval", "recall", responses, *scoring, check=1).stderr.split())
    # eval compare asks the same verdict of a directory, and reads the one a report recorded (it never checked)
    report = tmp_path / "recall.json"
    report.write_text(cli("eval", "recall", out, *scoring, "--allow-train-overlap", "--json").stdout)
    for given in (f"ckpt={out}", f"ckpt={report}"):
        assert want in " ".join(cli("eval", "compare", given, *scoring, check=1).stderr.split())
    table = cli("eval", "compare", f"ckpt={report}", "--allow-train-overlap").stdout
    assert "training overlap allowed: 'ckpt'" in " ".join(table.split()) and want in " ".join(table.split()), table
    # the report page says it beside the recall it shows (funnel and eval section)
    (out.parent / "reports").mkdir()
    shutil.copy(report, out.parent / "reports" / "recall-ckpt.json")
    cli("report", out.parent, "--out", tmp_path / "page.html", check=False)
    page = " ".join(re.sub(r"<[^>]+>", " ", (tmp_path / "page.html").read_text()).split())
    assert page.count(f"training overlap allowed: {want}") == 2, page[-3000:]
    # a report printed by a refused run (exit 1) is never shown as allowed (before: "allowed", exit 0)
    refused = json.loads(cli("eval", "recall", out, *scoring, "--json", check=1).stdout)
    assert refused["train_overlap"]["allowed"] is False
    (out.parent / "reports" / "recall-ckpt.json").write_text(json.dumps(refused))
    cli("report", out.parent, "--out", tmp_path / "page.html", check=False)
    page = " ".join(re.sub(r"<[^>]+>", " ", (tmp_path / "page.html").read_text()).split())
    assert page.count(f"training overlap refused (eval recall exited 1): {want}") == 2 and "overlap allowed" not in page, page[-3000:]
    # a verdict no run could have reached is a damaged report, not a number to show (before: "99 of 3")
    for edit in ({"answered_in_training": 99}, {"answered_in_training": 0}, {"model": None}, {"trained_questions": None}, {"unresolved": "x"}):
        (tmp_path / "edited.json").write_text(json.dumps({**refused, "train_overlap": {**refused["train_overlap"], **edit}}))
        err = " ".join(cli("eval", "compare", f"e={tmp_path / 'edited.json'}", *scoring, "--allow-train-overlap", check=2).stderr.split())
        assert "train_overlap" in err and ("is more than" in err or "examples lists" in err or "without the model" in err), err
    # the pinned copy edited by hand (its qids emptied, its count kept) decides nothing: it fails closed
    manifest = json.loads((out / "_manifest.json").read_text())
    pinned = manifest["params"]["trained_questions"]
    manifest["params"]["trained_questions"] = {**pinned, "qids": []}
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=2))
    err = " ".join(cli("eval", "recall", out, *scoring, check=1).stderr.split())
    assert "training overlap cannot be checked:" in err and "trained_questions is not what grtool writes (0 qids" in err, err
    manifest["params"]["trained_questions"] = pinned
    del manifest["params"]["trained_questions"]  # as `retrieve` wrote it before the pin
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=2))
    err = " ".join(cli("eval", "recall", out.parent, *scoring, check=1).stderr.split())
    assert "training overlap cannot be checked" in err or "cannot be checked" in err, err
    assert "not there any more" in err
    allowed = json.loads(cli("eval", "recall", out, *scoring, "--allow-train-overlap", "--json").stdout)
    assert allowed["train_overlap"]["unresolved"] and allowed["responses"] == len(answered)


@pytest.mark.slow
def test_train_sft_records_the_questions_of_its_export(run, tmp_path, cli, tiny_model):
    sft = tmp_path / "sft.json"
    cli("export", "sft", run / "chains", "--corpus", run / "corpus", "--out", sft, "--split", "train")
    cli("train", "sft", sft, "--model", tiny_model, "--out", tmp_path / "ckpt", "--max-steps", "1", "--cutoff-len", "256", "--per-device-batch-size", "2")
    record = orjson.loads((tmp_path / "ckpt" / "grtool.json").read_bytes())["questions"]
    assert record["qids"] == sidecar(sft)["questions"]["qids"] and record["complete"] and record["sources"][0]["splits"] == ["train"]


# ------------------------------------------------------------------------------------------------ the demo


def demo_stages() -> dict:
    from grtool.pipeline.config import load_pipeline

    return {s.name: s for s in load_pipeline(REPO / "examples" / "demo.toml").stages}


def _feeds(stage, later) -> bool:
    """``stage`` writes something ``later`` reads (an argument or option value under one of its outputs)."""
    values = [str(a) for a in later.args] + [str(v) for v in later.options.values() if isinstance(v, str)]
    return any(v == out or v.startswith(out.rstrip("/") + "/") for out in stage.outputs for v in values)


def _upstream(stages: dict, name: str) -> set[str]:
    found, todo = set(), [name]
    while todo:
        current = stages[todo.pop()]
        for other in stages.values():
            if other.name not in found and other.name != current.name and _feeds(other, current):
                found.add(other.name)
                todo.append(other.name)
    return found


def _splits(stage) -> set[str]:
    value = stage.options.get("split")
    return set(value if isinstance(value, list) else [value] if value else [])


def test_demo_trains_on_no_question_it_scores():
    """Every stage that reads questions on the way to a checkpoint names its splits, and none is a split that a
    recall stage scores; every scored retrieve names its splits."""
    stages = demo_stages()
    scored: set[str] = set()
    for recall in (s for s in stages.values() if s.run == "eval recall"):
        for name in _upstream(stages, recall.name):
            if stages[name].run == "retrieve" and _feeds(stages[name], recall):
                assert _splits(stages[name]), f"{name} scores every question"
                scored |= _splits(stages[name])
    trained_from = {n for t in stages.values() if t.run.startswith("train ") for n in _upstream(stages, t.name)}
    readers = [n for n in trained_from if stages[n].run in QUESTION_STAGES]
    assert {"chains", "filters", "export-sft", "retrieve-sft-samples", "export-kto"} <= set(readers)
    for name in readers:
        assert _splits(stages[name]) and not _splits(stages[name]) & scored, f"{name} reads {_splits(stages[name]) or 'every split'}; scored: {scored}"
    assert scored == {"dev", "test"}


def test_demo_exports_hold_no_question_its_recall_scores(tmp_path, cli):
    """The demo's own splits on the bundled example corpus: the questions export sft and export kto write
    (read back from their records) and those the scored retrieve stages select are disjoint."""
    from grtool.store.questions import Selection

    stages = demo_stages()
    files = [a for s in stages.values() if s.run == "corpus ingest" for a in s.args]
    cli("corpus", "ingest", *(REPO / f for f in files), "--out", tmp_path / "corpus")
    corpus = tmp_path / "corpus"
    documents = read_table(corpus / "documents").to_pylist()
    questions = read_table(corpus / "questions").to_pylist()
    # a triple per document and a chain per question citing each gold document's: every chain passes the filters
    triple = {d["doc_id"]: (d["title"], "is described in", " ".join(d["text"].split()[:4])) for d in documents}
    write_stage(tmp_path / "triples", "triples", TRIPLES,
                 [{"doc_id": i, "idx": 0, "head": h, "relation": r, "tail": t, "docid": f"<docid_start>{h}, {r}, {t}<docid_end>"} for i, (h, r, t) in triple.items()])  # fmt: skip
    chains = []
    for q in questions:
        docids = [f"<docid_start>{', '.join(triple[g])}<docid_end>" for g in q["gold_doc_ids"]]
        steps = " ".join(f"I look up {d}." for d in docids)
        chains.append({"qid": q["qid"], "candidate": 0, "text": f"{steps} So the answer is {q['answer']}.", "docids": docids, "flipped": [False] * len(docids),
                       "selected": True, "score": 0.0, "model": "rule", "temperature": 0.0, "finish_reason": "stop"})  # fmt: skip
    write_stage(tmp_path / "chains", "chains", CHAINS, chains)

    def split_args(name: str) -> list[str]:
        return [a for s in sorted(_splits(stages[name])) for a in ("--split", s)]

    cli("filters", "apply", tmp_path / "chains", "--corpus", corpus, "--triples", tmp_path / "triples", "--out", tmp_path / "filtered", *split_args("filters"))
    cli("export", "sft", tmp_path / "filtered", "--corpus", corpus, "--out", tmp_path / "sft.json", *split_args("export-sft"))
    sft_qids = set(sidecar(tmp_path / "sft.json")["questions"]["qids"])
    # KTO: responses to the questions the sampling stage selects (a right and a wrong one each)
    sampled = Selection.of(corpus, splits=tuple(_splits(stages["retrieve-sft-samples"]))).qids()
    text = {c["qid"]: c["text"] for c in chains}
    lines = [{"qid": q, "response": r} for q in sorted(sampled) for r in (text[q], "So the answer is no.")]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cli("export", "kto", tmp_path / "samples.jsonl", "--corpus", corpus, "--triples", tmp_path / "triples", "--out", tmp_path / "kto.json", *split_args("export-kto"))
    kto_qids = set(sidecar(tmp_path / "kto.json")["questions"]["qids"])

    scored = set()
    for name in ("retrieve-sft", "retrieve-kto", "retrieve-base"):
        scored |= Selection.of(corpus, splits=tuple(_splits(stages[name]))).qids()
    assert len(sft_qids) >= 8 and len(kto_qids) >= 8 and len(scored) >= 12  # the example data holds both sides
    assert not sft_qids & scored and not kto_qids & scored
