"""`grtool retrieve --method bm25` on the bundled HotpotQA files: the same recall as bm25s called here directly, a
responses stage that `eval recall` (no --triples), TREC files and `eval compare` read like any other."""

from __future__ import annotations

import json

import pytest

from conftest import EXAMPLES, run_cli

bm25s = pytest.importorskip("bm25s")

HOTPOT = [EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json", EXAMPLES / "hotpotqa" / "hotpot_train_v1.1.example.json"]


def direct_bm25_recall(top_k: int | None = None, files: list = HOTPOT) -> dict[str, float]:
    """qid → recall of bm25s run here on the raw HotpotQA files, with the settings the docs state: a document is
    title + " " + its sentences joined (HotpotQA's sentences carry their spaces), English stopwords, no stemmer,
    Lucene BM25 k1 1.5 b 0.75, the top |gold| + 1 documents (the paper's protocol)."""
    records = [r for path in files for r in json.loads(path.read_text())]
    paragraphs = list(dict.fromkeys((title, "".join(sentences)) for r in records for title, sentences in r["context"]))
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize([f"{title} {text}" for title, text in paragraphs], stopwords="en", show_progress=False), show_progress=False)
    recalls = {}
    for r in records:
        gold = {title for title, _ in r["supporting_facts"]}
        k = top_k or len(gold) + 1
        found, _ = retriever.retrieve(bm25s.tokenize([r["question"]], stopwords="en", show_progress=False), k=k, show_progress=False)
        titles = {paragraphs[int(i)][0] for i in found[0]}
        recalls[r["_id"]] = len(titles & gold) / len(gold)
    return recalls


@pytest.fixture(scope="module")
def bm25_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bm25")
    run_cli("corpus", "ingest", *HOTPOT, "--out", root / "corpus")
    run_cli("retrieve", root / "corpus", "--method", "bm25", "--out", root / "bm25")
    return root


def recall_report(*args) -> dict:
    return json.loads(run_cli("eval", "recall", *args, "--json").stdout)


def test_bm25_recall_equals_bm25s_called_directly(bm25_run):
    report = recall_report(bm25_run / "bm25", "--corpus", bm25_run / "corpus", "--per-question")  # no --triples
    expected = direct_bm25_recall()
    got = {q["qid"]: q["recall"] for q in report["questions"]}
    assert got == pytest.approx(expected) and len(got) == 9
    assert report["recall"] == pytest.approx(sum(expected.values()) / len(expected))
    assert 0 < report["recall"] < 1  # the bundled questions do not make BM25 perfect: the comparison can fail
    assert report["docs_per_response"] == pytest.approx(3.0)  # |gold| + 1 = 3 for every 2-hop question
    assert report["seconds_per_query"]["mean"] > 0 and report["without_response"] == 0


@pytest.mark.real_data
def test_bm25_recall_on_real_hotpotqa_questions_equals_bm25s(shared_data, tmp_path):
    """The same check on the real HotpotQA dev and train samples (their own distractor paragraphs as the corpus)."""
    files = [shared_data / "hotpotqa" / "hotpot_dev_distractor_v1.sample.json", shared_data / "hotpotqa" / "hotpot_train_v1.1.sample.json"]
    run_cli("corpus", "ingest", *files, "--out", tmp_path / "corpus")
    run_cli("retrieve", tmp_path / "corpus", "--method", "bm25", "--out", tmp_path / "bm25")
    report = recall_report(tmp_path / "bm25", "--corpus", tmp_path / "corpus", "--per-question")
    expected = direct_bm25_recall(files=files)
    assert {q["qid"]: q["recall"] for q in report["questions"]} == pytest.approx(expected) and len(expected) >= 5
    assert 0 < report["recall"] < 1


def test_bm25_stage_is_a_responses_stage_and_resumes(bm25_run):
    proc = run_cli("show", bm25_run / "bm25", "--limit", "1")
    assert "bm25" in proc.stdout
    again = run_cli("retrieve", bm25_run / "corpus", "--method", "bm25", "--out", bm25_run / "bm25", "--json")
    assert json.loads(again.stdout)["responses"] == 9  # every part was done: nothing redone, the same rows
    changed = run_cli("retrieve", bm25_run / "corpus", "--method", "bm25", "--top-k", "1", "--out", bm25_run / "bm25", check=2)
    assert "top_k" in changed.stderr  # another setting on the same output is refused, as for every stage


def test_bm25_refuses_model_options(bm25_run, tmp_path):
    proc = run_cli("retrieve", bm25_run / "corpus", "--method", "bm25", "--index", tmp_path, "--out", tmp_path / "x", check=2)
    assert "--index: options of --method model" in " ".join(proc.stderr.split())
    proc = run_cli("retrieve", bm25_run / "corpus", "--method", "bm25", "--model", "x", "--samples", "2", "--out", tmp_path / "x", check=2)
    assert "--model, --samples: options of --method model" in " ".join(proc.stderr.split())
    proc = run_cli("retrieve", bm25_run / "corpus", "--out", tmp_path / "y", check=2)
    assert "--index is needed" in proc.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_trec_files_read_back_by_pytrec_eval_give_grtools_recall(bm25_run):
    pytrec_eval = pytest.importorskip("pytrec_eval")
    run_file, qrels_file = bm25_run / "bm25.trec", bm25_run / "gold.qrels"
    report = recall_report(bm25_run / "bm25", "--corpus", bm25_run / "corpus", "--trec-run", run_file, "--trec-qrels", qrels_file)
    run: dict[str, dict[str, float]] = {}
    for line in run_file.read_text().splitlines():
        qid, q0, doc, rank, score, tag = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    qrels: dict[str, dict[str, int]] = {}
    for line in qrels_file.read_text().splitlines():
        qid, _, doc, rel = line.split()
        qrels.setdefault(qid, {})[doc] = int(rel)
    measures = pytrec_eval.RelevanceEvaluator(qrels, {"recall"}).evaluate(run)
    assert len(measures) == 9
    assert sum(m["recall_1000"] for m in measures.values()) / len(measures) == pytest.approx(report["recall"])


def test_trec_files_go_beside_the_stages_they_score_never_inside(bm25_run):
    """A TREC file inside a run directory the command reads is fine, as every command's report is there (before:
    refused as inside the input); inside a stage it reads, refused."""
    corpus = bm25_run / "corpus"
    recall_report(bm25_run / "bm25", "--corpus", corpus, "--trec-run", corpus / "bm25.trec")
    assert (corpus / "bm25.trec").is_file()
    err = run_cli("eval", "recall", bm25_run / "bm25", "--corpus", corpus, "--trec-run", corpus / "questions" / "x.trec", check=2).stderr
    assert "questions/x.trec: lies inside" in " ".join(err.split()), err


def test_eval_recall_scores_another_retrievers_trec_run(bm25_run, tmp_path):
    """A run naming documents by title (as Wikipedia ids do, spaces as underscores), ranked deeper than the
    protocol: cut at |gold| + 1 by score, the same recall as bm25s's own top |gold| + 1."""
    records = [r for path in HOTPOT for r in json.loads(path.read_text())]
    paragraphs = list(dict.fromkeys((title, "".join(sentences)) for r in records for title, sentences in r["context"]))
    retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize([f"{t} {x}" for t, x in paragraphs], stopwords="en", show_progress=False), show_progress=False)
    lines = []
    for r in records:
        found, scores = retriever.retrieve(bm25s.tokenize([r["question"]], stopwords="en", show_progress=False), k=6, show_progress=False)
        lines += [f"{r['_id']} Q0 {paragraphs[int(i)][0].replace(' ', '_')} {rank} {s:.6f} direct" for rank, (i, s) in enumerate(zip(found[0], scores[0]), 1)]
    lines.reverse()  # the order of the lines is not the ranking: the scores are
    (tmp_path / "direct.trec").write_text("\n".join(lines) + "\n")
    report = recall_report("--run", tmp_path / "direct.trec", "--corpus", bm25_run / "corpus")
    expected = direct_bm25_recall()
    assert report["recall"] == pytest.approx(sum(expected.values()) / len(expected)) and report["hallucinated"] == 0
    deep = recall_report("--run", tmp_path / "direct.trec", "--corpus", bm25_run / "corpus", "--top-k", "6")
    assert deep["recall"] == pytest.approx(sum(direct_bm25_recall(6).values()) / 9)
    (tmp_path / "bad.trec").write_text(lines[0] + "\nq1 Q0 nowhere 1\n")
    proc = run_cli("eval", "recall", "--run", tmp_path / "bad.trec", "--corpus", bm25_run / "corpus", check=2)
    assert "bad.trec, line 2: expected 6 fields" in proc.stderr
    for score in ("nan", "inf", "1e400"):  # a NaN sorts nowhere: the ranking would follow the lines' order (before: exit 0)
        (tmp_path / "bad.trec").write_text(lines[0] + f"\nq1 Q0 nowhere 1 {score} t\n")
        proc = run_cli("eval", "recall", "--run", tmp_path / "bad.trec", "--corpus", bm25_run / "corpus", check=2)
        assert f"bad.trec, line 2: score '{score}' is not a finite number" in proc.stderr, proc.stderr
    (tmp_path / "unknown.trec").write_text(f"{records[0]['_id']} Q0 Not_In_The_Corpus 1 9.0 x\n")
    unknown = recall_report("--run", tmp_path / "unknown.trec", "--corpus", bm25_run / "corpus")
    assert unknown["hallucinated"] == 1 and unknown["recall"] == 0


def test_compare_gives_p_values_and_intervals(bm25_run):
    run_cli("retrieve", bm25_run / "corpus", "--method", "bm25", "--top-k", "1", "--out", bm25_run / "bm25-top1")
    runs = [f"protocol={bm25_run / 'bm25'}", f"top-1={bm25_run / 'bm25-top1'}", f"again={bm25_run / 'bm25'}", "--corpus", bm25_run / "corpus"]
    result = json.loads(run_cli("eval", "compare", *runs, "--json").stdout)
    worse, same = result["per_question"]["top-1"]["significance"], result["per_question"]["again"]["significance"]
    assert worse["p_value"] < 0.05 and worse["ci95"][1] < 0 and worse["difference"] < 0
    assert worse["questions"] == 9 and "approximate randomization" in worse["test"] and worse["seed"] == 0
    assert same["p_value"] == 1 and same["ci95"] == [0, 0] and same["difference"] == 0
    assert result["metrics"]["protocol"]["seconds_per_query_mean"] > 0
    again = json.loads(run_cli("eval", "compare", *runs, "--json").stdout)
    assert again["per_question"] == result["per_question"]  # seeded: the same p-values and intervals every time
    md = run_cli("eval", "compare", *runs).stdout
    assert "| again | 0 | 0 | 9 | 9 | +0.0000 | [+0.0000, +0.0000] | 1 |" in md
    paper = run_cli("eval", "compare", *runs, "--layout", "paper").stdout.splitlines()
    assert "| run | hotpotqa | Average | s/query | p vs protocol |" in paper
    row = next(line for line in paper if line.startswith("| top-1 |")).split("|")
    assert float(row[2]) == pytest.approx(100 * result["recall"]["hotpotqa"]["top-1"], abs=0.05) and row[2] == row[3]
    assert float(row[5]) < 0.05 and next(line for line in paper if line.startswith("| again |")).endswith("| 1 |")
