"""`grtool corpus overlap`: the fast n-gram overlap against a plain NLTK computation of the definition."""

from __future__ import annotations

import json
import random
import sys

import pytest
from nltk.tokenize import RegexpTokenizer
from nltk.util import ngrams

from grtool.corpus.overlap import document_text, overlap_counts, overlap_of_rows, parse_ns, word_regex
from grtool.errors import InputError
from grtool.store.io import InputTable

NS = list(range(4, 13))
_TOKENIZER = RegexpTokenizer(r"\w+")


def reference_overlap(question: str, gold_docs: list[tuple[str, str]], n: int) -> tuple[int, int]:
    """The definition, spelled out with NLTK: (shared distinct n-grams, distinct question n-grams)."""
    q_grams = set(ngrams(_TOKENIZER.tokenize(question.lower()), n))
    d_grams: set = set()
    for title, text in gold_docs:
        tokens = _TOKENIZER.tokenize(title.lower()) + _TOKENIZER.tokenize(text.lower())
        d_grams |= set(ngrams(tokens, n))
    return len(q_grams & d_grams), len(q_grams)


def reference_means(corpus_rows: list[dict], documents: dict[str, tuple[str, str]]) -> dict[str, dict[str, float]]:
    sums: dict[str, dict[int, list[float]]] = {}
    for q in corpus_rows:
        docs = [documents[d] for d in q["gold_doc_ids"]]
        if not docs:
            continue
        for n in NS:
            shared, total = reference_overlap(q["question"], docs, n)
            if total:
                sums.setdefault(q["dataset"], {}).setdefault(n, []).append(shared / total)
    return {ds: {str(n): sum(v) / len(v) for n, v in per_n.items()} for ds, per_n in sums.items()}


def ingest(cli, tmp_path, *files) -> tuple:
    out = tmp_path / "corpus"
    cli("corpus", "ingest", *files, "--out", out)
    questions = list(InputTable.open(out, "questions").iter_rows())
    documents = {d["doc_id"]: (d["title"], d["text"]) for d in InputTable.open(out, "documents").iter_rows()}
    return out, questions, documents


def test_word_regex_matches_python_word_class_on_every_code_point():
    """polars splits exactly where NLTK splits, for every character."""
    import polars as pl

    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    spaced = " ".join(chars)  # every character alone between spaces: a token iff it is a word character
    assert pl.Series([spaced]).str.extract_all(word_regex())[0].to_list() == _TOKENIZER.tokenize(spaced)


def test_counts_equal_reference_on_tricky_text():
    questions = [
        "What is the capital of the Second Polish Republic's successor?",
        "Who wrote İstanbul's ΟΔΟΣ x² ½ caf\u0065\u0301 notes, and when did the Nobel committee?",
        "too short",
        "a b c d a b c d a b c d",  # repeated n-grams count once
        "",
    ]
    docs = [
        ("Second Polish Republic", "The capital of the Second Polish Republic was Warsaw."),
        ("İstanbul", "ΟΔΟΣ x² ½ café notes were written by someone; the Nobel committee met."),
        ("Letters", "a b c d a b c d"),
    ]
    gold = [[0], [1, 0], [2], [2], [0]]
    found, distinct = overlap_counts(questions, gold, [document_text(t, x) for t, x in docs], NS)
    for i, q in enumerate(questions):
        for k, n in enumerate(NS):
            assert (found[i, k], distinct[i, k]) == reference_overlap(q, [docs[j] for j in gold[i]], n), (i, n)
    assert found[0, 0] > 0 and distinct[2].sum() == 0


def test_title_and_text_do_not_merge_into_one_token():
    # "Paris" + "France ..." must stay two tokens: the 4-gram "paris france is a" exists only across them.
    found, distinct = overlap_counts(["paris france is a country"], [[0]], [document_text("Paris", "France is a country.")], [4])
    assert (found[0, 0], distinct[0, 0]) == reference_overlap("paris france is a country", [("Paris", "France is a country.")], 4) == (2, 2)


def test_random_corpus_equals_reference():
    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(40)] + ["É", "straße", "x²", "ß"]
    docs = [(" ".join(rng.choices(vocab, k=3)), " ".join(rng.choices(vocab, k=rng.randint(0, 60)))) for _ in range(30)]
    rows = []
    for _ in range(300):
        gold = rng.sample(range(len(docs)), rng.randint(1, 3))
        src = docs[gold[0]][1].split()
        start = rng.randint(0, max(len(src) - 1, 0))
        q = " ".join(src[start : start + rng.randint(0, 14)] + rng.choices(vocab, k=rng.randint(0, 8)))
        rows.append(("ds", q.upper() if rng.random() < 0.2 else q, gold))
    found, distinct = overlap_counts([q for _, q, _ in rows], [g for _, _, g in rows], [document_text(*d) for d in docs], NS)
    for i, (_, q, g) in enumerate(rows):
        for k, n in enumerate(NS):
            assert (found[i, k], distinct[i, k]) == reference_overlap(q, [docs[j] for j in g], n)
    # Chunking changes nothing: the same numbers with tiny chunks.
    small = overlap_of_rows(rows, [document_text(*d) for d in docs], NS, chunk=7)
    whole = overlap_of_rows(rows, [document_text(*d) for d in docs], NS)
    for n in NS:
        assert small.mean["ds"][n] == pytest.approx(whole.mean["ds"][n], abs=1e-12)
        assert small.share_any["ds"][n] == whole.share_any["ds"][n] and small.counted == whole.counted


def test_parse_ns():
    assert parse_ns("4-12") == NS
    assert parse_ns("4,6, 8") == [4, 6, 8]
    assert parse_ns("5") == [5]
    for bad in ("x", "12-4", "0-3", ""):
        with pytest.raises(InputError):
            parse_ns(bad)


def test_hotpotqa_and_musique_equal_independent_computation(cli, tmp_path, examples):
    out, questions, documents = ingest(
        cli,
        tmp_path,
        examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json",
        examples / "hotpotqa" / "hotpot_train_v1.1.example.json",
        examples / "musique" / "musique_ans_v1.0_dev.example.jsonl",
        examples / "musique" / "musique_ans_v1.0_train.example.jsonl",
    )
    plot = tmp_path / "overlap.png"
    report = json.loads(cli("corpus", "overlap", out, "--json", "--plot", plot).stdout)
    # per_dataset holds only datasets, each only its own numbers; run-wide facts have keys of their own
    assert set(report) == {"ns", "per_dataset", "left_out", "tokenizer"} and report["ns"] == NS
    assert all(set(v) == {"questions", "mean", "share_with_overlap", "questions_with_ngrams"} for v in report["per_dataset"].values())
    got = {ds: v["mean"] for ds, v in report["per_dataset"].items()}
    want = reference_means(questions, documents)
    assert set(want) == {"hotpotqa", "musique"}
    for ds in want:
        assert list(got[ds]) == [str(n) for n in NS]  # exactly the n keys, in order
        for n in NS:
            if str(n) in want[ds]:
                assert got[ds][str(n)] == pytest.approx(want[ds][str(n)], abs=1e-12), (ds, n)
            else:
                assert got[ds][str(n)] is None
            assert got[ds][str(n)] is None or 0.0 <= got[ds][str(n)] <= 1.0
    per = report["per_dataset"]
    assert all(per[ds]["questions"] == sum(q["dataset"] == ds for q in questions) for ds in ("hotpotqa", "musique"))
    assert 0 < per["hotpotqa"]["share_with_overlap"]["4"] <= 1
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = cli("corpus", "overlap", out, "--n", "4,8").stderr
    assert "hotpotqa" in table and "n=8" in table and "n=5" not in table


@pytest.mark.real_data
def test_real_hotpotqa_questions_copy_more_of_their_gold_than_musique(cli, tmp_path, shared_data):
    """The paper's observation, a property of the real questions: HotpotQA's copy far more of their gold documents
    than MuSiQue's. On these small samples no question shares an 11-gram, so the comparison is strict where
    HotpotQA has any."""
    files = ("hotpotqa/hotpot_dev_distractor_v1.sample.json", "hotpotqa/hotpot_train_v1.1.sample.json",
             "musique/musique_ans_v1.0_dev.sample.jsonl", "musique/musique_ans_v1.0_train.sample.jsonl")  # fmt: skip
    out, _, _ = ingest(cli, tmp_path, *(shared_data / f for f in files))
    got = {ds: v["mean"] for ds, v in json.loads(cli("corpus", "overlap", out, "--json").stdout)["per_dataset"].items()}
    for n in NS:
        hotpot, musique = got["hotpotqa"][str(n)], got["musique"][str(n)]
        assert hotpot > musique or hotpot == musique == 0.0, n
    assert got["hotpotqa"]["4"] > 2 * got["musique"]["4"]


def test_missing_corpus_is_an_input_error(cli, tmp_path):
    proc = cli("corpus", "overlap", tmp_path / "nope", check=2)
    assert "nope" in proc.stderr
    proc = cli("corpus", "overlap", tmp_path, "--n", "z", check=2)
