"""`grtool show`: rows beside their question, gold documents (titled) and the verdict of each docid.

The run is real and model-free: the 2Wiki sample ingested, its evidence triples as the triples stage, `chains gold`,
then `filters apply` over those chains plus two edited ones: one citing a triple of another question's gold
document (non-gold), one citing a triple that exists nowhere (hallucinated).
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from chains_helpers import TWO_WIKI
from conftest import run_cli

from grtool.store.stage import read_table

MADE_UP = "<docid_start>Nobody Atall, place of birth, Nowhere Town<docid_end>"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    from grtool.triples.evidence import write_evidence_stage

    d = tmp_path_factory.mktemp("show")
    run_cli("-q", "corpus", "ingest", TWO_WIKI, "--out", d / "corpus")
    write_evidence_stage(d / "corpus", d / "triples")
    run_cli("-q", "chains", "gold", d / "corpus", "--triples", d / "triples", "--out", d / "chains")
    chains = read_table(d / "chains").to_pylist()
    questions = {q["qid"]: q for q in read_table(d / "corpus" / "questions").to_pylist()}
    titles = dict(zip(*read_table(d / "corpus" / "documents", ["doc_id", "title"]).to_pydict().values()))
    a, b, c = chains[0], chains[1], chains[2]
    # a cites b's first triple in place of its own second: stored, but in a document that is not a's gold
    non_gold = dict(a, text=a["text"].replace(a["docids"][1], b["docids"][0]), docids=[a["docids"][0], b["docids"][0]])
    hallucinated = dict(c, text=c["text"].replace(c["docids"][1], MADE_UP), docids=[c["docids"][0], MADE_UP])
    rows = [r for r in chains if r["qid"] not in (a["qid"], c["qid"])] + [non_gold, hallucinated]
    run_cli("-q", "filters", "apply", "-", "--corpus", d / "corpus", "--triples", d / "triples", "--out", d / "filtered", input="".join(json.dumps(r) + "\n" for r in rows))
    return {"dir": d, "chains": chains, "questions": questions, "titles": titles, "a": a, "b": b, "c": c}


def show(*args, check=True) -> subprocess.CompletedProcess:
    return run_cli("show", *args, check=check)


def show_json(*args) -> list[dict]:
    return [json.loads(line) for line in show(*args, "--json").stdout.splitlines()]


def test_non_gold_and_hallucinated_docids_are_marked_with_the_filters_verdict(run) -> None:
    d, a, b, c = run["dir"], run["a"], run["b"], run["c"]
    [row] = show_json(d / "filtered", "--reason", "gold", "--qid", a["qid"])
    assert row["kind"] == "filtered" and row["key"]["qid"] == a["qid"]
    assert "gold-outside" in row["rejected"]["reasons"] and "non-gold" in row["rejected"]["detail"]
    assert [x["verdict"] for x in row["docids"]] == ["gold", "non-gold"]
    b_doc = row["docids"][1]["documents"]
    assert [x["doc_id"] for x in b_doc] == [g for g in run["questions"][b["qid"]]["gold_doc_ids"] if g in {x["doc_id"] for x in b_doc}]
    assert b_doc[0]["title"] == run["titles"][b_doc[0]["doc_id"]] and b_doc[0]["gold"] is False
    gold = run["questions"][a["qid"]]["gold_doc_ids"]
    assert [g["doc_id"] for g in row["question"]["gold"]] == gold and all(g["title"] == run["titles"][g["doc_id"]] for g in row["question"]["gold"])
    assert row["question"]["answer"] == run["questions"][a["qid"]]["answer"]

    # docid-exists: only the made-up triple's chain; its docid names no document
    [row] = show_json(d / "filtered", "--reason", "docid-exists")
    assert row["key"]["qid"] == c["qid"] and "docid-exists-missing" in row["rejected"]["reasons"]
    assert [(x["verdict"], x["documents"]) for x in row["docids"]][1] == ("hallucinated", [])
    assert row["docids"][1]["text"] == MADE_UP and row["text"][row["docids"][1]["start"] : row["docids"][1]["end"]] == MADE_UP

    # the kept rows are all gold, and the two edited ones are not among them
    kept = show_json(d / "filtered", "--limit", "0")
    assert len(kept) == len(run["chains"]) - 2 and {a["qid"], c["qid"]}.isdisjoint(r["key"]["qid"] for r in kept)
    assert all(x["verdict"] == "gold" for r in kept for x in r["docids"])


def test_a_reason_nothing_was_rejected_for_names_the_reasons_there_are(run) -> None:
    proc = show(run["dir"] / "filtered", "--reason", "length", check=2)
    assert "no rejected row has a reason of 'length'" in proc.stderr and "gold-outside (1)" in proc.stderr
    assert "no row of nope" in show(run["dir"] / "chains", "--qid", "nope", check=2).stderr


def test_plain_text_off_a_terminal_has_the_question_titles_and_verdicts(run) -> None:
    d, a = run["dir"], run["a"]
    q = run["questions"][a["qid"]]
    out = show(d / "chains", "--qid", a["qid"]).stdout
    assert "\x1b[" not in out  # no colour codes in a pipe
    assert q["question"] in out and f"answer        {q['answer']}" in out
    for g in q["gold_doc_ids"]:
        assert f"{run['titles'][g]} ({g})" in out
    assert out.count("[gold] <docid_start>") == len(a["docids"]) and out.rstrip().endswith(f"{len(a['docids'])} gold, 0 non-gold, 0 hallucinated")


def test_on_a_terminal_docids_are_coloured_by_verdict(run) -> None:
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "grtool", "show", str(run["dir"] / "filtered"), "--reason", "gold", "--qid", run["a"]["qid"]], stdout=slave, stderr=subprocess.PIPE, env=env, timeout=120
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    out = b"".join(chunks).decode()
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[1;32m" in out and "\x1b[1;33m" in out  # gold in bold green, non-gold in bold yellow


def test_a_seeded_sample_is_reproducible_and_drawn_from_the_stage(run) -> None:
    d = run["dir"]
    first = [r["key"]["qid"] for r in show_json(d / "chains", "--sample", "3", "--seed", "7")]
    again = [r["key"]["qid"] for r in show_json(d / "chains", "--sample", "3", "--seed", "7")]
    assert first == again and len(set(first)) == 3 and set(first) <= {r["qid"] for r in run["chains"]}
    seeds = {tuple(r["key"]["qid"] for r in show_json(d / "chains", "--sample", "3", "--seed", str(s))) for s in range(6)}
    assert len(seeds) > 1
    assert len(show_json(d / "chains", "--sample", "1000")) == len(run["chains"])


def test_triples_of_a_question_are_its_gold_documents_triples(run) -> None:
    d, a = run["dir"], run["a"]
    rows = show_json(d / "triples", "--qid", a["qid"])
    gold = set(run["questions"][a["qid"]]["gold_doc_ids"])
    assert rows and {r["key"]["doc_id"] for r in rows} <= gold
    assert all(r["key"]["title"] == run["titles"][r["key"]["doc_id"]] and r["docids"][0]["verdict"] == "gold" for r in rows)
    assert set(a["docids"]) <= {r["text"] for r in rows}


def test_responses_show_the_documents_they_retrieve_with_titles(run, tmp_path: Path) -> None:
    """A responses stage as `retrieve` writes it (written here through the stage writer: no model needed)."""
    from grtool.store.schemas import RESPONSES
    from grtool.store.stage import StageSpec, StageWriter

    d, a, b = run["dir"], run["a"], run["b"]
    gold_a = run["questions"][a["qid"]]["gold_doc_ids"]
    gold_b = run["questions"][b["qid"]]["gold_doc_ids"]
    text = f"First {a['docids'][0]} then {b['docids'][0]} and {MADE_UP}. Last <docid_start>never closed"
    row = {
        "qid": a["qid"],
        "sample": 0,
        "dataset": "2wikimultihopqa",
        "text": text,
        "docids": [a["docids"][0], b["docids"][0], MADE_UP],
        "flipped": [False, False, False],
        "doc_ids": [gold_a[0], gold_b[0]],
        "n_docids": 3,
        "malformed": 1,
        "tokens": 40,
        "latency_ms": 1.0,
        "finish_reason": "stop",
        "model": "test",
        "markers": "special",
        "mode": "docids",
    }
    inputs = [str(d / "corpus" / "questions"), str(d / "triples")]
    stage = StageWriter(tmp_path / "responses", StageSpec("responses", RESPONSES, {}, inputs=inputs), num_parts=1)
    with stage.shard(0) as shard:
        shard.count_in(1)
        shard.write_rows([row])
    stage.finish()
    [shown] = show_json(tmp_path / "responses")
    assert [x["verdict"] for x in shown["docids"]] == ["gold", "non-gold", "hallucinated", "malformed"]
    assert shown["docids"][3]["text"] == "<docid_start>" and shown["docids"][3]["documents"] == []
    assert [(r["doc_id"], r["title"], r["gold"]) for r in shown["retrieved"]] == [(gold_a[0], run["titles"][gold_a[0]], True), (gold_b[0], run["titles"][gold_b[0]], False)]
    out = show(tmp_path / "responses").stdout
    assert f"{run['titles'][gold_b[0]]} ({gold_b[0]}) [non-gold]" in out and "[malformed] <docid_start>" in out
    assert out.rstrip().endswith("1 gold, 1 non-gold, 1 hallucinated, 1 malformed")


def test_an_exported_file_is_matched_to_its_questions(run, tmp_path: Path) -> None:
    d, b = run["dir"], run["b"]
    out = tmp_path / "sft.json"
    run_cli("-q", "export", "sft", d / "filtered", "--corpus", d / "corpus", "--out", out, "--format", "llamafactory-sharegpt")
    [row] = show_json(out, "--qid", b["qid"])
    assert row["kind"] == "export" and row["key"]["qid"] == b["qid"] and row["question"]["question"] == run["questions"][b["qid"]]["question"]
    assert row["text"] == b["text"] and [x["verdict"] for x in row["docids"]] == ["gold"] * len(b["docids"])


def test_bad_input_is_one_line(run, tmp_path: Path) -> None:
    assert "no such file or directory" in show(tmp_path / "nothing", check=2).stderr
    (tmp_path / "rows.json").write_text("[]")
    assert "not an exported file" in show(tmp_path / "rows.json", check=2).stderr


def test_a_corpus_is_shown_by_its_tables_views(run) -> None:
    """A stage that holds no docids is shown by its table's view: questions with their answer and titled gold
    documents, documents under their id with title and text; --qid on a table without a qid column is one line."""
    d, a = run["dir"], run["a"]
    q = run["questions"][a["qid"]]
    [row] = show_json(d / "corpus", "--qid", a["qid"])  # a corpus directory: its questions
    assert row["kind"] == "questions" and row["key"] == {"qid": a["qid"]} and row["text"] is None and not row["docids"]
    assert row["question"]["question"] == q["question"] and row["question"]["answer"] == q["answer"]
    assert [g["title"] for g in row["question"]["gold"]] == [run["titles"][g] for g in q["gold_doc_ids"]]
    plain = show(d / "corpus" / "documents", "--limit", "2").stdout
    first = read_table(d / "corpus" / "documents").to_pylist()[0]
    assert f"── 1/2 documents doc_id {first['doc_id']}" in plain and first["title"] in plain and first["text"] in plain
    assert plain.rstrip().endswith("2 rows") and "docids" not in plain
    said = " ".join(show(d / "corpus" / "documents", "--qid", a["qid"], check=2).stderr.split())
    assert "--qid picks rows by their question; a documents table has no qid column" in said, said


def test_a_questions_stage_is_its_own_question_data_and_rejected_records_show_what_they_hold(run, tmp_path: Path) -> None:
    """`--corpus` gives a questions stage its documents, never other questions (a split corpus shows its own
    splits); a record ingest rejected is shown with every field it holds; a run directory of documents alone shows
    them; --qid with --reason on a table without a qid column is the same one line."""
    import shutil

    d, a = run["dir"], run["a"]
    run_cli("-q", "corpus", "split", d / "corpus", "--ratios", "0.5,0.5", "--names", "train,dev", "--resplit", "--out", tmp_path / "split")
    own = {r["qid"]: r["split"] for r in read_table(tmp_path / "split" / "questions", ["qid", "split"]).to_pylist()}
    [row] = show_json(tmp_path / "split", "--qid", a["qid"], "--corpus", d / "corpus")
    assert row["question"]["split"] == own[a["qid"]] and [g["title"] for g in row["question"]["gold"]] == [run["titles"][g] for g in run["questions"][a["qid"]]["gold_doc_ids"]]

    records = json.loads(Path(TWO_WIKI).read_text())
    records[0]["question"] = "   "
    (tmp_path / "dev.json").write_text(json.dumps(records))
    run_cli("-q", "corpus", "ingest", tmp_path / "dev.json", "--out", tmp_path / "blank", "--allow-rejects")
    [rejected] = show_json(tmp_path / "blank", "--reason", "empty question")
    assert rejected["rejected"]["reasons"] == ["empty question"] and rejected["fields"]["answer"] == records[0]["answer"], rejected

    shutil.copytree(d / "corpus" / "documents", tmp_path / "docs-only" / "documents")
    assert show_json(tmp_path / "docs-only", "--limit", "1")[0]["kind"] == "documents"
    said = " ".join(show(d / "corpus" / "documents", "--reason", "x", "--qid", a["qid"], check=2).stderr.split())
    assert "a documents table has no qid column" in said, said


def test_a_declared_table_with_numeric_qids_and_bytes_is_shown(tmp_path: Path) -> None:
    """A table a command declared may hold values JSON has no type for (bytes) and qids as numbers: `show --json`
    prints them as text, `--qid 7` finds the row whose qid is 7."""
    import pyarrow as pa

    from grtool.store.partloop import Output, PartLoop
    from grtool.store.schemas import register_table
    from grtool.store.stage import StageSpec

    schema = pa.schema([("id", pa.string()), ("qid", pa.int64()), ("blob", pa.binary()), ("note", pa.string())])
    register_table("test_blobs", schema, ("id",), text="note")
    rows = [{"id": f"r{i}", "qid": i, "blob": bytes([i, 255]), "note": f"row {i}"} for i in range(10)]

    def write(part):
        part.shard.count_in(len(rows))
        part.shard.write_rows(rows)

    loop = PartLoop([Output(tmp_path / "blobs", StageSpec("test_blobs", schema))], 1)
    loop.run(write)
    loop.finish()
    [row] = show_json(tmp_path / "blobs", "--qid", "7")
    assert row["key"] == {"id": "r7"} and row["text"] == "row 7" and row["fields"]["blob"] == str(bytes([7, 255])), row
    assert "row 3" in show(tmp_path / "blobs").stdout


def test_index_query_names_documents_with_their_titles(run) -> None:
    """`index query` follows the index's triples back to their corpus for the titles (or takes --corpus)."""
    d, a = run["dir"], run["a"]
    run_cli("-q", "index", "build", d / "triples", "--tokenizer", "llama3", "--out", d / "index")
    docid = a["docids"][0]
    got = json.loads(run_cli("index", "query", d / "index", docid, "--json").stdout)
    assert got["docs"] and got["titles"] == {doc: run["titles"][doc] for doc in got["docs"]}
    assert set(got["docs"]) <= set(run["questions"][a["qid"]]["gold_doc_ids"])
    proc = run_cli("index", "query", d / "index", docid, "--corpus", d / "corpus")
    assert all(f"{run['titles'][doc]} ({doc})" in proc.stdout + proc.stderr for doc in got["docs"])
