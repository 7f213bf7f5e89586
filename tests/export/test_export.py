"""`grtool export sft / kto / gmr` on the samples corpus (our own 2WikiMultihopQA and MuSiQue records), with
hand-checked values.

The corpus (documents + questions stages) is the ingest of tests/data's samples records; the triples stage holds
2Wiki's own `evidences` triples plus triples written by hand from the paragraph texts, among them one collision:
three Venn Alder paragraphs all say that Liva Marren is Aurel Venn Alder's second wife.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.vocab.prompt import instruction
from grtool.vocab.gmr import render_document
from grtool.export.shuffle import unit_hash
from conftest import run_cli
from grtool.store.schemas import CHAINS
from sample_helpers import (
    MARA_BRACKETS,
    MARA_FLIPPED_EXACT,
    TIN_HALF,
    MOTHER_COLLIDING,
    MOTHER_EXACT,
    MOTHER_FLIPPED_AND_HALLUCINATED,
    MOTHER_MALFORMED,
    MOTHER_NOTHING,
    MUSIQUE,
    Q_MARA,
    Q_TIN,
    Q_MOTHER,
    Q_BELLS,
    SPECIAL,
    BELLS_ONE_OF_FOUR,
    WIKI,
    write_chains,
    write_responses,
    write_stage,
)


def flat(text: str) -> str:
    """stderr with Rich's line wrapping undone."""
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------- KTO


@pytest.mark.parametrize(
    "tau, desirable, undesirable, dropped, weights",
    [
        # 0.5: exact ones desirable; MOTHER_NOTHING (0) and BELLS (0.25) below; the four at exactly 0.5 dropped,
        # and MOTHER_COLLIDING (recall 1, extra documents) dropped.
        (0.5, [MOTHER_EXACT, MARA_FLIPPED_EXACT], [MOTHER_NOTHING, BELLS_ONE_OF_FOUR], 5, (1.0, 1.0)),
        # 0.25: BELLS's recall is exactly tau → dropped; 2 desirable vs 1 undesirable → up-weight the undesirable.
        (0.25, [MOTHER_EXACT, MARA_FLIPPED_EXACT], [MOTHER_NOTHING], 6, (1.0, 2.0)),
        # 1.0: everything short of full recall is undesirable; full recall with an extra document is still dropped.
        (
            1.0,
            [MOTHER_EXACT, MARA_FLIPPED_EXACT],
            [MOTHER_FLIPPED_AND_HALLUCINATED, MOTHER_MALFORMED, MARA_BRACKETS, TIN_HALF, MOTHER_NOTHING, BELLS_ONE_OF_FOUR],
            1,
            (3.0, 1.0),
        ),
    ],
)
def test_kto_labels_at_the_tau_boundary(cli, samples, tmp_path, tau, desirable, undesirable, dropped, weights):
    root = samples["root"]
    responses = write_responses(tmp_path / "samples.jsonl")
    out = tmp_path / "data" / "thinkgr_kto.jsonl"
    proc = cli("export", "kto", responses, "--corpus", root, "--triples", root / "triples", "--tau", str(tau), "--format", "trl", "--out", out, "--json")
    summary = json.loads(proc.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got_desirable = [r["completion"][0]["content"] for r in rows if r["label"] is True]
    got_undesirable = [r["completion"][0]["content"] for r in rows if r["label"] is False]
    assert got_desirable == desirable
    assert got_undesirable == undesirable
    assert (summary["desirable"], summary["undesirable"], summary["dropped"]) == (len(desirable), len(undesirable), dropped)
    assert (summary["desirable_weight"], summary["undesirable_weight"]) == weights
    assert summary["unknown_qid"] == 1
    assert "no-such-question" in flat(proc.stderr)
    # TRL unpaired-preference rows: conversational prompt (the SFT instruction) / completion / bool label.
    first = rows[0]
    assert set(first) == {"prompt", "completion", "label"}
    assert first["prompt"] == [{"role": "user", "content": instruction(samples["question"][Q_MOTHER])}]
    assert first["completion"] == [{"role": "assistant", "content": MOTHER_EXACT}]
    assert not (out.parent / "dataset_info.json").exists()  # TRL needs no registry


def test_kto_desirable_rule_exact_or_all_gold(cli, samples, tmp_path):
    """exact (default): MOTHER_COLLIDING (every gold document plus the colliding extras) is dropped; all-gold: it
    is desirable. The summary and --json state the rule."""
    root = samples["root"]
    responses = write_responses(tmp_path / "samples.jsonl")
    labels = {}
    for rule in (None, "exact", "all-gold"):
        out = tmp_path / f"kto-{rule}.jsonl"
        proc = cli("export", "kto", responses, "--corpus", root, "--triples", root, "--format", "trl", "--out", out, "--json", *(["--desirable", rule] if rule else []))
        summary = json.loads(proc.stdout)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        labels[rule] = {r["completion"][0]["content"]: r["label"] for r in rows}
        assert summary["desirable_rule"] == (rule or "exact") and summary["rule"] in flat(proc.stderr)
    assert labels[None] == labels["exact"] and MOTHER_COLLIDING not in labels["exact"]
    assert [c for c, label in labels["all-gold"].items() if label] == [MOTHER_EXACT, MOTHER_COLLIDING, MARA_FLIPPED_EXACT]
    assert {c: label for c, label in labels["all-gold"].items() if c != MOTHER_COLLIDING} == labels["exact"]
    assert summary["rule"] == "desirable: retrieves every gold document (extra documents allowed); undesirable: recall < 0.5; dropped: the rest"
    assert "is not one of" in cli("export", "kto", responses, "--corpus", root, "--triples", root, "--out", tmp_path / "x.jsonl", "--desirable", "some", check=2).stderr


def test_kto_llamafactory_rows_and_stanza(cli, samples, tmp_path):
    root = samples["root"]
    responses = write_responses(tmp_path / "samples.jsonl")
    out = tmp_path / "data" / "thinkgr_kto.json"
    cli("export", "kto", responses, "--corpus", root, "--triples", root, "--out", out, "--system", "You retrieve.")
    rows = json.loads(out.read_text())  # one JSON array, as LLaMA-Factory's examples
    assert [r["kto_tag"] for r in rows] == [True, True, False, False]
    assert rows[0] == {
        "conversations": [{"from": "human", "value": instruction(samples["question"][Q_MOTHER])}, {"from": "gpt", "value": MOTHER_EXACT}],
        "kto_tag": True,
        "system": "You retrieve.",
    }
    info = json.loads((out.parent / "dataset_info.json").read_text())
    assert info == {
        "thinkgr_kto": {
            "file_name": "thinkgr_kto.json",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "kto_tag": "kto_tag"},
            "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"},
        }
    }


def test_kto_exits_1_when_a_class_is_empty(cli, samples, tmp_path):
    root = samples["root"]
    responses = write_responses(tmp_path / "only_good.jsonl", [(Q_MOTHER, MOTHER_EXACT), (Q_MARA, MARA_FLIPPED_EXACT)])
    proc = cli("export", "kto", responses, "--corpus", root, "--triples", root, "--out", tmp_path / "k.json", check=1)
    assert "no undesirable responses" in flat(proc.stderr)
    # a failed export writes and registers nothing (it wrote the file, its record and the dataset_info entry)
    assert not (tmp_path / "k.json").exists() and not (tmp_path / "k.json.grtool.json").exists() and not (tmp_path / "dataset_info.json").exists()


# ------------------------------------------------------------------------------------------------- SFT

LLAMAFACTORY_SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}


def test_sft_llamafactory_sharegpt_with_dataset_info(cli, samples, tmp_path):
    chains = write_chains(samples, tmp_path / "filtered")
    out = tmp_path / "data" / "thinkgr_sft.json"
    (out.parent).mkdir()
    (out.parent / "dataset_info.json").write_text(json.dumps({"alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}}))
    proc = cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", out, "--system", "You are a retriever.", "--json")
    summary = json.loads(proc.stdout)
    rows = json.loads(out.read_text())
    assert len(rows) == 16 == summary["train"]  # 10 2Wiki + 6 MuSiQue questions
    assert summary["not_selected"] == 1 and summary["unknown_qid"] == 1
    assert summary["per_dataset"] == {
        MUSIQUE: {"chains": 6, "train": 6, "dev": 0, "capped": 0},
        WIKI: {"chains": 10, "train": 10, "dev": 0, "capped": 0},
    }
    mother = next(r for r in rows if r["conversations"][1]["value"] == chains[Q_MOTHER])
    assert mother == {
        "conversations": [
            {"from": "human", "value": instruction("Where was the mother of Oskar Venn Alder born?")},
            {"from": "gpt", "value": chains[Q_MOTHER]},
        ],
        "system": "You are a retriever.",
    }
    assert mother["conversations"][0]["value"].endswith("Question: Where was the mother of Oskar Venn Alder born?")
    info = json.loads((out.parent / "dataset_info.json").read_text())
    assert info["alpaca_en_demo"] == {"file_name": "alpaca_en_demo.json"}  # other datasets are kept
    assert info["thinkgr_sft"] == {
        "file_name": "thinkgr_sft.json",
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "system": "system"},
        "tags": LLAMAFACTORY_SHAREGPT_TAGS,
    }
    assert f"{WIKI}" in proc.stderr and "10" in proc.stderr  # counts per dataset on stderr


def test_sft_alpaca_brackets_split_and_caps(cli, samples, tmp_path):
    write_chains(samples, tmp_path / "filtered")
    out = tmp_path / "lf" / "sft.json"

    def export(to: Path, *extra: str):
        return cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", to, "--format", "llamafactory-alpaca", "--markers", "brackets", *extra)

    summary = json.loads(export(out, "--dev-share", "0.3", "--max-per-dataset", "5", "--seed", "7", "--json").stdout)
    train, dev = json.loads(out.read_text()), json.loads((out.parent / "sft_dev.json").read_text())
    # The dev side is exactly the questions whose qid hash falls below the share, capped or not.
    expected_dev = {q for q in samples["gold"] if unit_hash(q) < 0.3}
    dev_questions = {next(q for q, t in samples["question"].items() if r["instruction"].endswith(f"Question: {t}")) for r in dev}
    assert dev_questions == expected_dev and 0 < len(dev) < 16
    per = summary["per_dataset"]
    for name, total in ((WIKI, 10), (MUSIQUE, 6)):
        n_dev = sum(1 for q in expected_dev if samples["dataset"][q] == name)
        assert per[name]["dev"] == n_dev
        assert per[name]["train"] == min(5, total - n_dev)
        assert per[name]["capped"] == total - n_dev - per[name]["train"]
    assert len(train) == per[WIKI]["train"] + per[MUSIQUE]["train"]
    row = train[0]
    assert set(row) == {"instruction", "input", "output"} and row["input"] == ""
    assert "<docid_start>" not in row["output"] and ", is about, something]" in row["output"]
    assert "[head, relation, tail]" in row["instruction"]
    info = json.loads((out.parent / "dataset_info.json").read_text())
    alpaca_columns = {"prompt": "instruction", "query": "input", "response": "output"}
    assert info == {
        "sft": {"file_name": "sft.json", "formatting": "alpaca", "columns": alpaca_columns},
        "sft_dev": {"file_name": "sft_dev.json", "formatting": "alpaca", "columns": alpaca_columns},
    }
    # Same seed → same file; another seed → another order of the same training rows.
    export(tmp_path / "again.json", "--dev-share", "0.3", "--max-per-dataset", "5", "--seed", "7")
    assert (tmp_path / "again.json").read_bytes() == out.read_bytes()
    export(tmp_path / "s8.json", "--dev-share", "0.3", "--seed", "8")
    export(tmp_path / "s9.json", "--dev-share", "0.3", "--seed", "9")
    s8, s9 = (json.loads((tmp_path / f"s{n}.json").read_text()) for n in (8, 9))
    assert len(s8) == 16 - len(dev) and sorted(map(str, s8)) == sorted(map(str, s9)) and s8 != s9


def test_sft_trl_messages_to_stdout(cli, samples, tmp_path):
    chains = write_chains(samples, tmp_path / "filtered")
    proc = cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", "-", "--format", "trl-messages")
    rows = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout holds only the data
    assert len(rows) == 16
    mother = next(r for r in rows if r["messages"][-1]["content"] == chains[Q_MOTHER])
    assert mother == {
        "messages": [
            {"role": "user", "content": instruction(samples["question"][Q_MOTHER])},
            {"role": "assistant", "content": chains[Q_MOTHER]},
        ]
    }
    assert "18 chains read; skipped: 1 not selected, 1 unknown qid" in flat(proc.stderr)
    cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", "-", "--dev-share", "0.1", check=2)
    # --all-candidates adds the non-selected candidate of the first question (the unknown qid stays out).
    every = cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", "-", "--format", "trl-messages", "--all-candidates")
    answers = [json.loads(line)["messages"][-1]["content"] for line in every.stdout.splitlines()]
    assert len(answers) == 17 and "a second candidate" in answers


def test_cannot_answer_sentence_is_named_in_the_instruction_and_recorded(cli, samples, tmp_path):
    """--cannot-answer: the instruction `export sft|kto` writes and `retrieve` sends names the sentence; the
    export record keeps it; without it the instruction is as before."""
    from grtool.chains.corpus_examples import Example
    from grtool.retrieve.prompt import RetrievePrompt

    sentence = "No answer from these triples."
    assert "say that the question cannot be answered." in instruction("Q?")
    assert f'finish with "{sentence}"' in instruction("Q?", "special", sentence) and "Question: Q?" in instruction("Q?", "special", sentence)
    assert "{x}" in instruction("Q?", "special", "{x}")  # braces are text, not a template field
    write_chains(samples, tmp_path / "filtered")
    out = tmp_path / "sft.jsonl"
    cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", out, "--format", "trl-messages", "--cannot-answer", sentence)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["messages"][0]["content"] == instruction(r["messages"][0]["content"].rsplit("Question: ", 1)[1], "special", sentence) for r in rows)
    assert json.loads((tmp_path / "sft.jsonl.grtool.json").read_text())["params"] == {"cannot_answer": sentence}
    # retrieve sends the same user turn, with and without worked examples
    prompt = RetrievePrompt("special", [Example("q0", "Who?", "c", (("a", "b", "c"),))], 1, cannot_answer=sentence)
    assert [m["content"] for m in prompt.messages("q1", "Q?") if m["role"] == "user"] == [instruction("Who?", "special", sentence), instruction("Q?", "special", sentence)]
    assert prompt.sha256() != RetrievePrompt("special", prompt.examples, 1).sha256()
    assert "--cannot-answer" in cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", tmp_path / "x.jsonl", "--cannot-answer", "", check=2).stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_sft_no_thought_keeps_the_docids_and_the_answer(cli, samples, tmp_path):
    """--no-thought (the w/o Thought ablation): the answer turn is the chain's docids in order and its closing
    sentence; the thought sentences between them are gone; the export record says so."""
    mara = SPECIAL("Mara, My Harbour", "director", "Toma Sandu")
    born = SPECIAL("Toma Sandu", "place of birth", "Bucharest")
    chains = {Q_MARA: f"I look up the director. {mara} Then where he was born. {born} So the answer is Bucharest."}
    rows = [{"qid": qid, "candidate": 0, "text": text, "docids": [], "flipped": [], "selected": True, "score": 0.1, "model": "m", "temperature": 0.0, "finish_reason": "stop"}
            for qid, text in chains.items()]  # fmt: skip
    rows.append({**rows[0], "qid": Q_MOTHER, "text": f"A step. {SPECIAL('a', 'b', 'c')} and an open <docid_start>d, e"})
    write_stage(tmp_path / "filtered", "chains", CHAINS, rows)
    out = tmp_path / "sft.jsonl"
    proc = cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", out, "--format", "trl-messages", "--markers", "brackets", "--no-thought", "--json")
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["messages"][-1]["content"] == "[Mara, My Harbour, director, Toma Sandu] [Toma Sandu, place of birth, Bucharest] So the answer is Bucharest."
    assert row["messages"][0]["content"] == instruction(samples["question"][Q_MARA], "brackets")  # the prompt is unchanged
    assert json.loads(proc.stdout)["broken_chain"] == 1  # markers that do not pair up: left out, counted
    assert json.loads((tmp_path / "sft.jsonl.grtool.json").read_text())["params"] == {"no_thought": True}
    cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", tmp_path / "full.jsonl", "--format", "trl-messages")
    assert "I look up the director." in (tmp_path / "full.jsonl").read_text()  # without the flag the chain is whole


# ------------------------------------------------------------------------------------------------- GMR


def test_gmr_pairs_follow_hop_order(cli, samples, tmp_path):
    out = tmp_path / "gmr.jsonl"
    summary = json.loads(cli("export", "gmr", samples["root"], "--out", out, "--memorization", "--json").stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    docs = {d["doc_id"]: render_document(d["title"], d["text"]) for d in samples["documents"].values()}
    mother = [r for r in rows if r.get("qid") == Q_MOTHER]
    m_doc = docs[samples["doc"]["Oskar Venn Alder"]]
    z_doc = docs[samples["doc"]["Liva Marren"]]
    assert m_doc.startswith("Oskar Venn Alder: Oskar Venn Alder (born 18 April 1988)")
    q = "<QUESTION> Where was the mother of Oskar Venn Alder born? </QUESTION>"
    assert [(r["step"], r["input"], r["target"]) for r in mother] == [
        (0, q, m_doc),
        (1, f"{q} <EVIDENCE> {m_doc} </EVIDENCE>", z_doc),
        (2, f"{q} <EVIDENCE> {m_doc} </EVIDENCE> <EVIDENCE> {z_doc} </EVIDENCE>", "DONE"),
    ]
    # Four gold documents in supporting-fact order: films first, then their directors.
    bells = [r for r in rows if r.get("qid") == Q_BELLS]
    order = ["Three Bells at Noon", "When the River Went Quiet", "Hedda von Koralin", "Marius Tennerescu"]
    assert [r["doc_id"] for r in bells] == [samples["doc"][t] for t in order] + [None]
    assert bells[-1]["input"].count("<EVIDENCE>") == 4
    # MuSiQue keeps the decomposition's order (paragraph 5, then 2).
    tin = [r for r in rows if r.get("qid") == Q_TIN]
    assert [r["target"].split(":")[0] for r in tin] == ["Harbor of Tin (film)", "List of awards received by Nela Quist", "DONE"]
    assert summary["questions"] == 16 and summary["retrieval_pairs"] == sum(len(g) + 1 for g in samples["gold"].values())
    # Memorization: "Ruben Venn Alder: Ruben Venn Alder (born 11 November 1991, known as R.V.A.) is a rower from
    # Vennmark." has 18 words → the first int(0.7 · 18) = 12, then 6.
    mem = next(r for r in rows if r["kind"] == "memorization" and r["doc_id"] == samples["doc"]["Ruben Venn Alder"])
    assert mem["input"] == "Ruben Venn Alder: Ruben Venn Alder (born 11 November 1991, known as"
    assert mem["target"] == "R.V.A.) is a rower from Vennmark."
    assert summary["memorization_pairs"] == len(samples["documents"])


def test_gmr_chunking_does_not_change_the_pairs(samples):
    # Memory is bounded by --chunk-questions: gold documents are looked up one chunk of questions at a time.
    from grtool.export.gmr import GmrResult, iter_gmr

    whole, chunked = GmrResult(), GmrResult()
    assert list(iter_gmr(samples["root"], whole)) == list(iter_gmr(samples["root"], chunked, chunk_questions=5))
    assert whole.as_dict() == chunked.as_dict() and whole.missing_gold_document == 0


# ------------------------------------------------------------------------------------ validate exports


def _validate_json(path: Path, code: int) -> dict:
    return json.loads(run_cli("validate", path, "--json", check=code).stdout)


def _problems(out: dict, name: str) -> list[str]:
    return [p for s in out["stages"] if Path(s["path"]).name == name for p in s["problems"]]


def test_exports_are_recorded_and_validated(cli, samples, tmp_path):
    root = samples["root"]
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    cli("export", "sft", tmp_path / "filtered", "--corpus", root, "--out", data / "sft.json", "--dev-share", "0.3")
    cli("export", "sft", tmp_path / "filtered", "--corpus", root, "--out", data / "sft_alpaca.json", "--format", "llamafactory-alpaca")
    cli("export", "sft", tmp_path / "filtered", "--corpus", root, "--out", data / "sft.jsonl", "--format", "trl-messages")
    cli("export", "kto", write_responses(tmp_path / "samples.jsonl"), "--corpus", root, "--triples", root, "--out", data / "kto.json")
    cli("export", "kto", tmp_path / "samples.jsonl", "--corpus", root, "--triples", root, "--out", data / "kto_trl.jsonl", "--format", "trl")
    cli("export", "gmr", root, "--out", data / "gmr.jsonl", "--memorization")

    # Each file has its provenance record: command, version, inputs, rows, checksum, dataset_info entry.
    record = json.loads((data / "sft.json.grtool.json").read_text())
    train = json.loads((data / "sft.json").read_text())
    assert record["kind"] == "sft" and record["trainer_format"] == "llamafactory-sharegpt" and record["split"] == "train"
    assert record["rows"] == len(train) and record["command"][:3] == ["grtool", "export", "sft"] and record["grtool_version"]
    assert record["dataset_info"] == {"file": "dataset_info.json", "entry": "sft"}
    assert [i["table"] for i in record["inputs"]] == ["chains", "questions"] and all(i["kind"] == "stage" for i in record["inputs"])
    assert json.loads((data / "sft_dev.json.grtool.json").read_text())["split"] == "dev"
    assert json.loads((data / "gmr.jsonl.grtool.json").read_text())["rows"] == len((data / "gmr.jsonl").read_text().splitlines())

    out = _validate_json(data, 0)
    by_name = {Path(s["path"]).name: s for s in out["stages"]}
    assert set(by_name) == {"sft.json", "sft_dev.json", "sft_alpaca.json", "sft.jsonl", "kto.json", "kto_trl.jsonl", "gmr.jsonl", "dataset_info.json"}
    assert by_name["sft.json"]["checked"]["rows"] == len(train) and by_name["dataset_info.json"]["checked"]["entries"] == 4
    assert all(s["notes"] == [] for s in out["stages"])
    run_cli("validate", data / "kto.json")  # one file alone

    # A row of the wrong shape, written back as valid JSON: the checksum and the shape both say so.
    train[1] = {"conversations": [{"from": "gpt", "value": "answer first"}, {"from": "human", "value": "question"}]}
    (data / "sft.json").write_text(json.dumps(train))
    out = _validate_json(data, 1)
    problems = _problems(out, "sft.json")
    assert any("changed since it was written" in p for p in problems), problems
    assert any("1 of" in p and "not sft llamafactory-sharegpt rows" in p and "row 2: conversations roles are ['gpt', 'human']" in p for p in problems), problems

    # A truncated JSON Lines file; a registered file removed; a dangling dataset_info entry.
    lines = (data / "gmr.jsonl").read_bytes()
    (data / "gmr.jsonl").write_bytes(lines[: len(lines) // 2])
    (data / "sft_dev.json").unlink()
    info = json.loads((data / "dataset_info.json").read_text())
    info["old_run"] = {"file_name": "old_run.json", "formatting": "sharegpt"}
    (data / "dataset_info.json").write_text(json.dumps(info))
    out = _validate_json(data, 1)
    assert any("is not valid JSON" in p for p in _problems(out, "gmr.jsonl")), _problems(out, "gmr.jsonl")
    assert any("sft_dev.json: missing" in p for p in _problems(out, "sft_dev.json"))
    info_problems = _problems(out, "dataset_info.json")
    assert any("entry 'old_run' points to old_run.json, which does not exist" in p for p in info_problems)
    assert any("entry 'sft_dev' points to sft_dev.json, which does not exist" in p for p in info_problems)


def test_export_of_changed_inputs_is_stale_and_unrecorded_files_are_checked_by_their_entry(cli, samples, tmp_path):
    root = samples["root"]
    write_chains(samples, tmp_path / "filtered")
    out = tmp_path / "data" / "sft.json"
    cli("export", "sft", tmp_path / "filtered", "--corpus", root, "--out", out)
    _validate_json(out.parent, 0)
    # The filtered chains are made again (other rows): the export no longer reflects them.
    import shutil

    shutil.rmtree(tmp_path / "filtered")
    write_chains({**samples, "gold": dict(list(samples["gold"].items())[:5])}, tmp_path / "filtered")
    problems = _problems(_validate_json(out.parent, 1), "sft.json")
    assert any(p.startswith("stale: input") and "filtered" in p for p in problems), problems
    # A file without a sidecar (an older grtool) is still parsed by its dataset_info entry's formatting.
    (out.parent / "sft.json.grtool.json").unlink()
    rows = json.loads(out.read_text())
    rows[0] = {"conversation": []}
    out.write_text(json.dumps(rows))
    result = _validate_json(out.parent, 1)
    [info] = [s for s in result["stages"] if s["table"] == "dataset_info"]
    assert any("row 1: missing conversations (columns.messages)" in p for p in info["problems"]), info
    assert any("no sft.json.grtool.json" in n for n in info["notes"])


def test_an_export_killed_between_its_record_and_its_file_is_named_and_exported_again(cli, samples, tmp_path):
    """The record is written first, then the file renamed into place: a kill in between leaves a record the file
    does not match (validate exits 1 naming it; the next export replaces both), never a file without its record,
    which grtool would then refuse to replace."""
    import signal

    from hold_helpers import held

    def held_pid(holds):
        return (holds / "recorded.reached").read_text()

    root = samples["root"]
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    sft = ["export", "sft", tmp_path / "filtered", "--corpus", root, "--out", data / "sft.json", "--dev-share", "0.3"]
    gmr = ["export", "gmr", root, "--out", data / "gmr.jsonl"]
    cli(*sft)
    before = (data / "sft.json").read_bytes()
    assert held([*sft, "--system", "Think first."], "recorded", signal.SIGKILL, tmp_path / "holds").returncode == -signal.SIGKILL
    assert held(gmr, "recorded", signal.SIGKILL, tmp_path / "holds2").returncode == -signal.SIGKILL
    assert not (data / "gmr.jsonl").exists() and (data / "gmr.jsonl.grtool.json").is_file()  # its first run: the record only
    assert (data / "sft.json").read_bytes() == before  # the old file stays whole

    out = _validate_json(data, 1)
    assert any("gmr.jsonl: missing, but gmr.jsonl.grtool.json records it" in p and "stopped" in p for p in _problems(out, "gmr.jsonl"))
    assert _problems(_validate_json(data / "gmr.jsonl", 1), "gmr.jsonl")  # named by its path too (before: exit 2, no such file)
    listed = {Path(e["path"]).name: e for e in json.loads(cli("status", data, "--json").stdout)["exports"]}
    assert listed["gmr.jsonl"]["rows"] == "-" and "file missing" in listed["gmr.jsonl"]["kind"]  # before: its recorded rows, as if there
    stopped = _problems(out, "sft.json") + _problems(out, "sft_dev.json")
    assert any("an export stopped before its new file was in place" in p and "export it again" in p for p in stopped), stopped
    stopped = held(gmr, "recorded", signal.SIGTERM, tmp_path / "holds4")  # Slurm's time limit, at the same point
    assert stopped.returncode == 75 and "gmr.jsonl: its new record is written and the file is not" in flat(stopped.stderr), stopped.stderr
    cli(*sft, "--system", "Think first.")  # replaced: each record says grtool wrote the file it stands beside
    cli(*gmr)
    assert _validate_json(data, 0)["stages"]
    assert held(gmr, "recorded", signal.SIGKILL, tmp_path / "holds3").returncode == -signal.SIGKILL
    killed = f".gmr.{held_pid(tmp_path / 'holds3')}.grtool-tmp.jsonl"
    assert [p.name for p in data.iterdir() if "tmp" in p.name] == [killed]  # what a kill leaves
    (data / ".gmr.4242.tmp.jsonl").write_text("a user's file, named like a scratch file without grtool's mark\n")
    live = data / ".gmr.1.grtool-tmp.jsonl"  # a running process's (pid 1 always runs): never a killed run's
    live.write_text("being written\n")
    cli(*gmr)  # ... the next export of that file removes, and nothing else
    assert sorted(p.name for p in data.iterdir() if "tmp" in p.name) == sorted([".gmr.4242.tmp.jsonl", live.name])


def test_an_export_edited_by_hand_is_the_users_and_no_export_replaces_it(cli, samples, tmp_path):
    """An export's record names its bytes (and those it replaced): an export edited since is the user's, refused by
    the next export before any work, its edit kept; validate says so (before: replaced with exit 0, the edit lost)."""
    import signal

    from hold_helpers import held

    root = samples["root"]
    data = tmp_path / "data"
    gmr = ["export", "gmr", root, "--out", data / "gmr.jsonl"]
    cli(*gmr)
    record = json.loads((data / "gmr.jsonl.grtool.json").read_text())
    assert record["replaces"] is None  # a first export replaced nothing
    cli(*gmr)  # grtool's own bytes: replaced
    assert json.loads((data / "gmr.jsonl.grtool.json").read_text())["replaces"] == {"bytes": record["bytes"], "sha256": record["sha256"]}

    edited = (data / "gmr.jsonl").read_text().splitlines(keepends=True)[:3]
    (data / "gmr.jsonl").write_text("".join(edited))  # the user keeps three pairs, by hand
    err = flat(cli(*gmr, check=2).stderr)
    assert "gmr.jsonl: was changed since grtool wrote it" in err and "remove it yourself or choose another --out" in err, err
    assert (data / "gmr.jsonl").read_text() == "".join(edited)
    problems = _problems(_validate_json(data, 1), "gmr.jsonl")
    assert any("changed since it was written" in p and "it is yours now" in p for p in problems), problems

    (data / "gmr.jsonl").unlink()  # moved away: exported again, and a run stopped before its rename is still grtool's
    cli(*gmr)
    assert held(gmr, "recorded", signal.SIGKILL, tmp_path / "holds").returncode == -signal.SIGKILL
    cli(*gmr)
    assert _validate_json(data, 0)["stages"]
    # An older grtool's record names no replaced bytes: a file it does not match is replaced, as that grtool did
    # (a stop before its rename looks the same), never refused as the user's after an upgrade.
    older = json.loads((data / "gmr.jsonl.grtool.json").read_text())
    del older["replaces"]
    (data / "gmr.jsonl.grtool.json").write_text(json.dumps(older))
    (data / "gmr.jsonl").write_text("".join(edited))
    cli(*gmr)
    assert (data / "gmr.jsonl").read_text() != "".join(edited)


@pytest.mark.parametrize("planted", ["a directory", "a link", "a FIFO", "a user's file", "a record giving a key twice"])
def test_what_stands_where_an_export_s_record_goes_is_refused_before_any_work(cli, samples, tmp_path, planted):
    """The export's record is written last, over whatever stood at NAME.grtool.json: a directory there was a
    traceback after the work, a link, a FIFO or a user's file was replaced with exit 0; a record giving a key twice
    was read last-wins by the check (exit 0) while validate called it damaged."""
    import os

    data = tmp_path / "data"
    data.mkdir()
    out, record = data / "gmr.jsonl", data / "gmr.jsonl.grtool.json"
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    if planted == "a directory":
        record.mkdir()
    elif planted == "a link":
        record.symlink_to(notes)
    elif planted == "a FIFO":
        os.mkfifo(record)
    elif planted == "a user's file":
        record.write_text("mine\n")
    else:
        cli("export", "gmr", samples["root"], "--out", out)
        text = record.read_text()
        record.write_text(text.replace("{", '{"bytes": 1, ', 1))
        assert any("field bytes is given twice" in p for p in _problems(_validate_json(data, 1), "gmr.jsonl"))
    err = flat(cli("export", "gmr", samples["root"], "--out", out, check=2).stderr)
    assert str(record) in err and ("where grtool keeps the file's record" in err), err
    assert sorted(p.name for p in data.iterdir()) == sorted(["gmr.jsonl.grtool.json", *(["gmr.jsonl"] if planted.startswith("a record") else [])])
    assert notes.read_text() == "mine\n"


def test_the_dev_file_beside_out_is_checked_as_an_output_before_any_work(cli, samples, tmp_path):
    """`--dev-share` writes NAME_dev.EXT beside --out: a user's file there is refused by name, before anything is
    read or written (before: found only once the rows were spilled, in --out's words)."""
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    data.mkdir()
    (data / "sft_dev.json").write_text("my notes\n")
    err = cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", data / "sft.json", "--dev-share", "0.3", check=2).stderr
    assert "--out (the file beside it)" in flat(err) and "sft_dev.json: exists and grtool did not write it" in flat(err), err
    assert flat(err).rstrip().endswith("choose another --out"), err  # the option to change, without the label's words
    assert sorted(p.name for p in data.iterdir()) == ["sft_dev.json"] and (data / "sft_dev.json").read_text() == "my notes\n"


def test_the_registry_is_never_an_export_is_updated_where_it_links_and_an_old_dev_split_is_named(cli, samples, tmp_path):
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    sft = ["export", "sft", tmp_path / "filtered", "--corpus", samples["root"]]
    # before: the export was committed as dataset_info.json, then the command failed on it (not a JSON object)
    err = cli(*sft, "--out", data / "dataset_info.json", check=2).stderr
    assert "is the name of the registry exports add their entries to" in flat(err) and not data.exists()
    # a registry kept elsewhere and linked in: before, the link was replaced by a file and the registry never grew
    shared = tmp_path / "shared" / "registry.json"
    shared.parent.mkdir()
    shared.write_text(json.dumps({"mine": {"file_name": "mine.json"}}))
    data.mkdir()
    (data / "dataset_info.json").symlink_to(shared)
    cli(*sft, "--out", data / "sft.json", "--dev-share", "0.3")
    assert (data / "dataset_info.json").is_symlink() and set(json.loads(shared.read_text())) == {"mine", "sft", "sft_dev"}
    # exported again without a dev split: the earlier one is named (its questions are in training now), not deleted;
    # the temporary dev file a killed run left goes (no process has that pid), as does every lock (before: the
    # registry's stayed)
    (data / ".sft_dev.99999999.grtool-tmp.json").write_text("a killed run's half file\n")
    err = cli(*sft, "--out", data / "sft.json").stderr
    assert "an earlier export's dev split is still there" in flat(err) and (data / "sft_dev.json").is_file()
    assert sorted(p.name for p in data.iterdir()) == ["dataset_info.json", "sft.json", "sft.json.grtool.json", "sft_dev.json", "sft_dev.json.grtool.json"]


@pytest.mark.parametrize("registry", ["not json", "[1, 2]", "a directory", "a link into a missing folder"])
def test_a_registry_that_cannot_take_the_entries_is_refused_before_any_work(cli, samples, tmp_path, registry):
    """Before: the export was written, then refused as it registered it (exit 2, a file in place and unregistered;
    exit 1 for a directory)."""
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    data.mkdir()
    if registry == "a directory":
        (data / "dataset_info.json").mkdir()
    elif registry.startswith("a link"):
        (data / "dataset_info.json").symlink_to(tmp_path / "gone" / "registry.json")
    else:
        (data / "dataset_info.json").write_text(registry)
    err = flat(cli("export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", data / "sft.json", check=2).stderr)
    assert "dataset_info.json" in err and ("fix or remove it" in err or "fix the link or remove it" in err), err
    assert sorted(p.name for p in data.iterdir()) == ["dataset_info.json"]


def test_json_with_rows_on_standard_output_is_refused(cli, samples, tmp_path):
    """--json prints the summary where --out - writes the rows: before, an export took both and silently left the
    summary out; refused before anything runs, as the other commands refuse it."""
    err = cli("export", "gmr", samples["root"], "--out", "-", "--json", check=2).stderr
    assert "--json prints the summary on stdout, where --out - writes the rows" in flat(err)


def test_an_export_edited_while_its_record_is_written_is_kept(cli, samples, tmp_path):
    """The file is looked at before its record is written and again just before the rename: an edit in between is
    the user's, kept, with exit 2 (before: replaced with exit 0, the edit lost)."""
    import os
    import subprocess
    import sys
    import time

    root = samples["root"]
    data, holds = tmp_path / "data", tmp_path / "holds"
    holds.mkdir()
    gmr = ["export", "gmr", root, "--out", data / "gmr.jsonl"]
    cli(*gmr)
    env = {**os.environ, "GRTOOL_HOLD": f"recorded:{holds}"}
    proc = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, gmr)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not (holds / "recorded.reached").exists():  # a state, not a time: the new record is written
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        (data / "gmr.jsonl").write_text("my own pairs\n")
    finally:
        (holds / "recorded.release").write_text("")
        err = flat(proc.communicate(timeout=600)[1])
    assert proc.returncode == 2 and "gmr.jsonl: was put there or changed while this run wrote it" in err, err
    assert (data / "gmr.jsonl").read_text() == "my own pairs\n" and not [p for p in data.iterdir() if "tmp" in p.name]
    problems = _problems(_validate_json(data, 1), "gmr.jsonl")
    assert any("it is yours now" in p for p in problems), problems
    (data / "gmr.jsonl").unlink()
    cli(*gmr)  # grtool's file again; then removed while the record is written: nothing to keep, the new file goes in
    (holds / "recorded.reached").unlink()
    (holds / "recorded.release").unlink()
    proc = subprocess.Popen([sys.executable, "-m", "grtool", *map(str, gmr)], stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not (holds / "recorded.reached").exists():
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.01)
        (data / "gmr.jsonl").unlink()
    finally:
        (holds / "recorded.release").write_text("")
        err = proc.communicate(timeout=600)[1]
    assert proc.returncode == 0 and (data / "gmr.jsonl").is_file(), err


def test_an_export_never_takes_over_the_entry_of_another_file(cli, samples, tmp_path):
    """An entry of dataset_info.json is named by its file's stem: an export to A.jsonl beside A.json would register
    "A" as A.jsonl and LLaMA-Factory would train on another file, exit 0. Refused before any work, naming both."""
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    sft = ["export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out"]
    cli(*sft, data / "A.json")
    registry = (data / "dataset_info.json").read_text()
    for other in ("A.jsonl", "A.JSON"):
        err = flat(cli(*sft, data / other, check=2).stderr)
        assert f"its entry 'A' registers A.json, and an export to {other} would take that name over" in err, err
        assert not (data / other).exists() and (data / "dataset_info.json").read_text() == registry
    info = json.loads((data / "dataset_info.json").read_text())
    info["A"]["file_name"] = "./A.json"  # the same file, spelled otherwise: its own entry
    (data / "dataset_info.json").write_text(json.dumps(info))
    cli(*sft, data / "A.json")
    (data / "A.json").unlink()  # its file gone: the entry is free
    cli(*sft, data / "A.jsonl")
    assert json.loads((data / "dataset_info.json").read_text())["A"]["file_name"] == "A.jsonl"


def test_an_export_s_dev_split_is_never_another_export_s_training_file(cli, samples, tmp_path):
    """A_dev.json, the dev split of the export A.json, replaced by an export to A_dev.json would hold training
    questions where A's trainer evaluates (before: replaced, exit 0, validate ok); and the other way round."""
    write_chains(samples, tmp_path / "filtered")
    data = tmp_path / "data"
    sft = ["export", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out"]
    cli(*sft, data / "A.json", "--dev-share", "0.3")
    dev = (data / "A_dev.json").read_bytes()
    err = flat(cli(*sft, data / "A_dev.json", check=2).stderr)
    assert "A_dev.json: is the dev split of the export beside it" in err and "would write its train split there" in err, err
    assert (data / "A_dev.json").read_bytes() == dev
    cli(*sft, data / "B_dev.json")  # an export's training file, named like B.json's dev split
    err = flat(cli(*sft, data / "B.json", "--dev-share", "0.3", check=2).stderr)
    assert "B_dev.json: is an export's training file" in err and "would write its dev split there" in err, err
    cli(*sft, data / "A.json", "--dev-share", "0.3")  # its own roles: replaced
