"""corpus ingest on the real dataset samples and the bundled examples.

Gold documents are checked against an independent reading of the JSON here: the expected (title, text)
pairs come straight from each dataset's own annotation, compared with the rows the gold doc ids point to.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from grtool.store.stage import read_table
from output_helpers import no_spaces, rows_by

SAMPLES = {
    "hotpotqa": [
        "hotpotqa/hotpot_dev_distractor_v1.sample.json",
        "hotpotqa/hotpot_dev_fullwiki_v1.sample.json",
        "hotpotqa/hotpot_train_v1.1.sample.json",
        "variants/hotpotqa_hf_datasets_format.sample.jsonl",
    ],
    "2wikimultihopqa": ["2wikimultihopqa/data_ids_dev.sample.json", "2wikimultihopqa/dev.sample.json"],
    "musique": ["musique/musique_ans_v1.0_dev.sample.jsonl", "musique/musique_ans_v1.0_train.sample.jsonl", "musique/musique_full_v1.0_train.sample.jsonl"],
    "morehopqa": ["morehopqa/morehopqa_final.sample.json"],
}


def load_records(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def norm(s: str) -> str:
    return " ".join(unicodedata.normalize("NFC", s).split())


# -------------------------------------------------------------- independent readings of each dataset


def expected_paragraphs(dataset: str, rec: dict) -> list[tuple[str, str]]:
    """Every paragraph a record carries, as (title, text) the way the dataset writes it."""
    if dataset == "musique":
        return [(p["title"], p["paragraph_text"]) for p in rec["paragraphs"]]
    ctx = rec["context"]
    if isinstance(ctx, dict):  # Hugging Face layout
        ctx = list(zip(ctx["title"], ctx["sentences"]))
    sep = {"hotpotqa": "", "2wikimultihopqa": " "}.get(dataset)
    if dataset == "morehopqa":  # MoreHopQA keeps the join of the dataset it was built from
        sep = "" if len(rec["_id"].split("_")[0]) == 24 else " "
    return [(t, s if isinstance(s, str) else sep.join(s)) for t, s in ctx]


def expected_gold(dataset: str, rec: dict) -> list[tuple[str, str]]:
    paras = expected_paragraphs(dataset, rec)
    if dataset in ("hotpotqa", "2wikimultihopqa"):
        sf = rec["supporting_facts"]
        titles = sf["title"] if isinstance(sf, dict) else [t for t, _ in sf]
        out = []
        for t in dict.fromkeys(titles):
            out += [p for p in paras if p[0] == t and p not in out]
        return out
    if dataset == "musique":
        if not rec["answerable"]:
            return []
        by_idx = {p["idx"]: (p["title"], p["paragraph_text"]) for p in rec["paragraphs"]}
        order = [s["paragraph_support_idx"] for s in rec["question_decomposition"]]
        supporting = [p["idx"] for p in rec["paragraphs"] if p["is_supporting"]]
        assert sorted(order) == sorted(supporting)  # the two annotations agree on these samples
        return [by_idx[i] for i in order]
    # MoreHopQA: all context paragraphs, in the order of the decomposition's support titles
    titles = [s["paragraph_support_title"] for s in rec["question_decomposition"] if s["paragraph_support_title"]]
    out = [p for t in titles for p in paras if p[0] == t]
    return list(dict.fromkeys(out + paras))


def qid_of(dataset: str, rec: dict) -> str:
    if dataset == "musique":
        return rec["id"] if rec["answerable"] else rec["id"] + "__unanswerable"
    return rec.get("_id", rec.get("id"))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    from conftest import SHARED_DATA, run_cli

    out = tmp_path_factory.mktemp("corpus") / "run"
    paths = [SHARED_DATA / p for files in SAMPLES.values() for p in files]
    run_cli("corpus", "ingest", *paths, "--out", out)
    return out


@pytest.mark.real_data
def test_real_samples_questions_gold_and_documents(ingested, shared_data):
    docs = rows_by(read_table(ingested / "documents"), "doc_id")
    questions = rows_by(read_table(ingested / "questions"), "qid")
    all_paragraphs: set[tuple[str, str]] = set()
    n_records = 0
    for dataset, files in SAMPLES.items():
        for f in files:
            records = load_records(shared_data / f)
            n_records += len(records)
            for rec in records:
                q = questions[qid_of(dataset, rec)]
                assert q["dataset"] == dataset
                got = [(docs[d]["title"], docs[d]["text"]) for d in q["gold_doc_ids"]]
                assert got == expected_gold(dataset, rec), (f, q["qid"])
                all_paragraphs.update((norm(t), norm(x)) for t, x in expected_paragraphs(dataset, rec))
                assert q["answerable"] == rec.get("answerable", True)
                assert q["question"] == rec["question"] and q["answer"] == rec["answer"]
    # exactly the question counts of the files, and one row per distinct paragraph
    assert len(questions) == n_records == 178
    assert len(docs) == len(all_paragraphs)
    assert {(norm(d["title"]), norm(d["text"])) for d in docs.values()} == all_paragraphs


@pytest.mark.real_data
def test_real_samples_dataset_specific_fields(ingested):
    questions = rows_by(read_table(ingested / "questions"), "qid")
    meta = {qid: json.loads(q["meta"]) for qid, q in questions.items()}
    q = questions["20aa14f60bdc11eba7f7acde48001122"]  # 2Wiki with ids
    assert q["type"] == "compositional"
    assert meta[q["qid"]]["evidences_id"][0] == ["Q6893462", "mother", "Q238774"] and meta[q["qid"]]["hops"] == 2
    q = questions["2hop__82713_84616"]  # MuSiQue
    assert q["type"] == "2hop" and q["answer_aliases"] == ["leading role", "star", "leading actress", "lead"]
    assert [s["paragraph_support_idx"] for s in meta[q["qid"]]["question_decomposition"]] == [1, 12]
    unanswerable = [x for x in questions.values() if x["dataset"] == "musique" and not x["answerable"]]
    assert len(unanswerable) == 4 and all(not x["gold_doc_ids"] for x in unanswerable)
    more = questions["20c85b260bde11eba7f7acde48001122_6"]
    assert more["split"] == "test" and meta[more["qid"]]["source_dataset"] == "2wikimultihopqa"
    assert meta[more["qid"]]["no_of_hops"] == 3 and "previous_question" in meta[more["qid"]]
    hotpot = questions["5ade063d5542995b365fabcd"]
    assert hotpot["type"] == "bridge" and meta[hotpot["qid"]]["level"] == "hard" and hotpot["split"] == "dev"
    # fullwiki: gold titles that the retrieved context lacks are named, not invented
    fullwiki = [m for m in meta.values() if m.get("setting") == "fullwiki"]
    assert len(fullwiki) == 20 and sum(len(m.get("gold_titles_missing", [])) for m in fullwiki) == 18


def test_validate_passes_then_fails_on_corrupted_shard(examples, cli, tmp_path):
    copy = tmp_path / "copy"
    cli("corpus", "ingest", examples / "hotpotqa", "--out", copy)
    cli("validate", copy)
    shard = copy / "documents" / "part-00000.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    proc = cli("validate", copy, check=1)
    assert "sha256" in proc.stdout + proc.stderr


@pytest.mark.real_data
def test_real_wiki_layout_and_splits(ingested):
    q = read_table(ingested / "questions").to_pylist()
    splits = {(r["dataset"], r["split"]) for r in q}
    assert ("hotpotqa", "train") in splits and ("musique", "dev") in splits and ("hotpotqa", "unknown") in splits
    man = json.loads((ingested / "documents" / "_manifest.json").read_bytes())
    assert man["complete"] and man["counters"]["in"] == man["counters"]["out"] + man["counters"]["merged"]


# ---------------------------------------------------------------------------- bundled examples


def test_bundled_examples_every_layout(examples, cli, tmp_path):
    out = tmp_path / "ex"
    cli("corpus", "ingest", examples, "--out", out)
    cli("validate", out)
    docs = rows_by(read_table(out / "documents"), "doc_id")
    questions = rows_by(read_table(out / "questions"), "qid")
    # 30 of the release layouts (12 train), 2 of the Hugging Face ones, 3 of the generic layout (1 train), 12 of the
    # inline layout (no split: docs/guides/own-data.md splits them)
    assert len(questions) == 47
    assert sum(q["split"] == "train" for q in questions.values()) == 13
    assert sum(q["dataset"] == "generic" for q in questions.values()) == 15
    assert sum(q["split"] == "unknown" for q in questions.values()) == 12
    by_title = {}
    for d in docs.values():
        by_title.setdefault(d["title"], []).append(d)
    # shared paragraphs collapse across datasets and layouts
    assert by_title["Jaws (film)"][0]["datasets"] == ["2wikimultihopqa", "morehopqa"]
    assert sorted(d["datasets"] for d in by_title["Sydney Opera House"]) == [["hotpotqa", "morehopqa"], ["morehopqa", "musique"], ["musique"]]
    # the dump's decomposed "é" is the same document as the composed one in the HotpotQA files
    assert len(by_title["Palais Garnier"]) == 1 and "Opéra" in by_title["Palais Garnier"][0]["text"]
    assert by_title["List of opera houses"][0]["text"] == ""  # an abstract-less page is kept
    # HF layout, train, fullwiki with a missing gold paragraph, MuSiQue twins, MoreHopQA string paragraph
    assert questions["5e1a0c7b5542990d2b00a017"]["split"] == "dev"  # "validation" in the file name
    # the fullwiki gold paragraph missing from the context is found in the Wikipedia dump of the same run
    fullwiki = questions["5e1a0c7b5542990d2b00a005"]
    meta = json.loads(fullwiki["meta"])
    assert meta["gold_titles_resolved"] == ["Italy"] and "gold_titles_missing" not in meta
    assert [docs[d]["title"] for d in fullwiki["gold_doc_ids"]] == [sf[0] for sf in meta["supporting_facts"]]
    assert "enwiki" not in docs[fullwiki["gold_doc_ids"][1]]["text"] and docs[fullwiki["gold_doc_ids"][1]]["datasets"] == ["hotpotqa"]
    assert not questions["2hop__900006_900007__unanswerable"]["answerable"]
    assert len(questions["2hop__900006_900007"]["gold_doc_ids"]) == 2
    mh = questions["3hop1__900003_900004_900005"]
    assert [docs[d]["title"] for d in mh["gold_doc_ids"]] == ["Mount Kilimanjaro", "Tanzania", "Dodoma"]
    more = questions["2hop__900001_900002_7"]
    assert [docs[d]["title"] for d in more["gold_doc_ids"]] == ["Sydney Opera House", "Pritzker Architecture Prize"]
    assert set(more["gold_doc_ids"]) <= set(questions["2hop__900001_900002"]["gold_doc_ids"])


def test_stdout_jsonl_tags_both_tables(examples, cli, tmp_path):
    proc = cli("corpus", "ingest", examples / "musique", "--out", "-")
    rows = [orjson.loads(line) for line in proc.stdout.splitlines()]
    tables = [r.pop("_table") for r in rows]
    assert tables.index("questions") > max(i for i, t in enumerate(tables) if t == "documents")
    cli("corpus", "ingest", examples / "musique", "--out", tmp_path / "dir")
    for table in ("documents", "questions"):
        expected = read_table(tmp_path / "dir" / table).to_pylist()
        assert [r for r, t in zip(rows, tables) if t == table] == expected


def test_stdin_input_gives_the_rows_of_the_file(examples, cli, tmp_path):
    import gzip

    source = examples / "musique" / "musique_ans_v1.0_dev.example.jsonl"
    cli("corpus", "ingest", source, "--out", tmp_path / "file")
    piped = subprocess_bytes_input(gzip.compress(source.read_bytes()), "corpus", "ingest", "-", "--split", "dev", "--out", tmp_path / "pipe")
    assert piped.returncode == 0, piped.stderr
    for table in ("documents", "questions"):
        assert read_table(tmp_path / "pipe" / table).to_pylist() == read_table(tmp_path / "file" / table).to_pylist()
    # Standard input cannot be compared with what made the directory: resuming from it is refused.
    again = subprocess_bytes_input(source.read_bytes(), "corpus", "ingest", "-", "--split", "dev", "--out", tmp_path / "pipe")
    assert again.returncode == 2 and b"standard input" in again.stderr and b"--overwrite" in again.stderr


def subprocess_bytes_input(data: bytes, *args):
    """Like the cli fixture, with binary data on stdin (a compressed stream)."""
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], input=data, capture_output=True, env=dict(os.environ))


def test_archive_and_compression_are_detected_from_bytes(examples, cli, tmp_path):
    import gzip
    import tarfile

    tree = examples / "hotpotqa-wiki"
    archive = tmp_path / "dump.tar.bz2"
    with tarfile.open(archive, "w:bz2") as tar:
        tar.add(tree, arcname="dump")
    plain = tmp_path / "musique_ans_v1.0_dev.data"  # no telling extension: content decides
    plain.write_bytes(gzip.compress((examples / "musique" / "musique_ans_v1.0_dev.example.jsonl").read_bytes()))
    cli("corpus", "ingest", archive, "--out", tmp_path / "a")
    cli("corpus", "ingest", tree, "--out", tmp_path / "b")
    a = read_table(tmp_path / "a" / "documents").sort_by("doc_id")
    b = read_table(tmp_path / "b" / "documents").sort_by("doc_id")
    assert a.equals(b) and a.num_rows == 10
    cli("corpus", "ingest", plain, "--out", tmp_path / "c")
    assert read_table(tmp_path / "c" / "questions").num_rows == 2


# ---------------------------------------------------------------------------------- bad input


def _no_shards(out: Path) -> bool:
    return not list(out.rglob("*.parquet"))


@pytest.mark.parametrize("cut", ["json-array", "jsonl", "bz2"])
def test_truncated_file_fails_with_its_name_and_leaves_no_shard(examples, cli, tmp_path, cut):
    good = examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    if cut == "json-array":
        bad = tmp_path / "hotpot_dev_distractor_v1.json"
        bad.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    elif cut == "jsonl":
        src = (examples / "musique" / "musique_ans_v1.0_dev.example.jsonl").read_bytes()
        bad = tmp_path / "musique_dev.jsonl"
        bad.write_bytes(src[: len(src) - 40])
    else:
        src = (examples / "hotpotqa-wiki" / "enwiki-20171001-abstracts" / "AA" / "wiki_00.bz2").read_bytes()
        bad = tmp_path / "wiki_00.bz2"
        bad.write_bytes(src[: len(src) // 2])
    out = tmp_path / "out"
    # a good file first: its rows must not become visible either
    proc = cli("corpus", "ingest", good, bad, "--out", out, check=2)
    message = no_spaces(proc.stderr)
    assert no_spaces(f"{bad}, ") in message and "truncated" in message
    assert _no_shards(out)


def test_unknown_schema_and_not_json(cli, tmp_path):
    odd = tmp_path / "odd_dev.json"
    odd.write_text(json.dumps([{"foo": 1, "bar": 2}]))
    proc = cli("corpus", "ingest", odd, "--out", tmp_path / "o1", check=2)
    assert no_spaces(f"{odd}, record 1: unknown schema") in no_spaces(proc.stderr)
    text = tmp_path / "notes.txt"
    text.write_text("hello world\n")
    proc = cli("corpus", "ingest", text, "--out", tmp_path / "o2", check=2)
    assert no_spaces(f"{text}: not JSON") in no_spaces(proc.stderr)
    assert _no_shards(tmp_path)


def test_bad_records_are_rejected_or_fatal_under_strict(examples, cli, tmp_path):
    lines = (examples / "musique" / "musique_ans_v1.0_dev.example.jsonl").read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["question"]
    wrong = json.loads(lines[0])
    wrong["id"] = "2hop__wrong_type"
    wrong["paragraphs"] = "not a list"
    bad = tmp_path / "musique_dev.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(broken), json.dumps(wrong)]) + "\n")
    out = tmp_path / "out"
    cli("corpus", "ingest", bad, "--out", out)
    q = read_table(out / "questions")
    assert q.num_rows == 1
    man = json.loads((out / "questions" / "_manifest.json").read_bytes())
    assert man["counters"]["rejected"] == {"missing field 'question'": 1, "field 'paragraphs' has the wrong type": 1}
    rejects = [json.loads(x) for x in (out / "questions" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
    assert {r["position"] for r in rejects} == {"line 2", "line 3"} and all(r["source"] == str(bad) for r in rejects)
    cli("validate", out)
    proc = cli("corpus", "ingest", bad, "--out", tmp_path / "strict", "--strict", check=2)
    assert no_spaces(f"{bad}, line 2: missing field 'question'") in no_spaces(proc.stderr)
    assert _no_shards(tmp_path / "strict")


def test_duplicate_qids_are_rejected(examples, cli, tmp_path):
    src = examples / "2wikimultihopqa" / "data_ids_dev.example.json"
    copy = tmp_path / "again_dev.json"
    copy.write_bytes(src.read_bytes())
    out = tmp_path / "out"
    cli("corpus", "ingest", src, copy, "--out", out)
    man = json.loads((out / "questions" / "_manifest.json").read_bytes())
    assert man["rows"] == 3 and man["counters"]["rejected"] == {"duplicate qid": 3}
    rejects = [json.loads(x) for x in (out / "questions" / "_rejects" / "part-00000.jsonl").read_text().splitlines()]
    assert all(r["source"] == str(copy) and str(src) in r["detail"] for r in rejects)
    docs = json.loads((out / "documents" / "_manifest.json").read_bytes())
    assert docs["counters"]["merged"] == docs["counters"]["in"] - docs["rows"] > 0
    proc = cli("corpus", "ingest", src, copy, "--out", tmp_path / "strict", "--strict", check=2)
    assert no_spaces(f"{copy}, record 1: duplicate qid") in no_spaces(proc.stderr) and _no_shards(tmp_path / "strict")


def test_rerun_is_a_noop_and_changed_parameters_are_refused(examples, cli, tmp_path):
    src = examples / "morehopqa"
    out = tmp_path / "out"
    cli("corpus", "ingest", src, "--out", out)
    before = (out / "questions" / "part-00000.parquet").stat().st_mtime_ns
    proc = cli("corpus", "ingest", src, "--out", out)
    assert "alreadycomplete" in no_spaces(proc.stderr)
    assert (out / "questions" / "part-00000.parquet").stat().st_mtime_ns == before
    proc = cli("corpus", "ingest", src, "--out", out, "--split", "dev", check=2)
    assert "--overwrite" in no_spaces(proc.stderr)
    cli("corpus", "ingest", src, "--out", out, "--split", "dev", "--overwrite")
    assert set(pq.read_table(out / "questions" / "part-00000.parquet").column("split").to_pylist()) == {"dev"}


def test_rows_per_part_spreads_a_small_corpus_over_many_parts(examples, cli, tmp_path):
    from grtool.corpus.dedup_spill import plan_parts

    # A bucket bigger than a part is cut into chunks: part indices stay 0..n-1 whatever the sizes.
    assert [p.index for p in plan_parts([120, 0, 30, 250], 50)] == list(range(9))
    source = examples / "hotpotqa" / "hotpot_train_v1.1.example.json"
    cli("corpus", "ingest", source, "--out", tmp_path / "one")
    cli("corpus", "ingest", source, "--out", tmp_path / "many", "--rows-per-part", "3")
    docs = len(read_table(tmp_path / "one" / "documents"))
    assert len(list((tmp_path / "many" / "documents").glob("part-*.parquet"))) >= docs // 3
    cli("validate", tmp_path / "many")
    for table in ("documents", "questions"):
        key = "doc_id" if table == "documents" else "qid"
        one = sorted(read_table(tmp_path / "one" / table).to_pylist(), key=lambda r: r[key])
        assert sorted(read_table(tmp_path / "many" / table).to_pylist(), key=lambda r: r[key]) == one


# ------------------------------------------------------------------- what each file was read as


@pytest.mark.parametrize("source", ["examples", pytest.param("shared_data", marks=pytest.mark.real_data)])
def test_every_file_is_detected_as_its_own_dataset(source, request):
    """Detection by shape: the first record of every bundled example and real sample names its dataset
    (the directory it sits in; the Hugging Face HotpotQA variant is HotpotQA)."""
    from grtool.corpus.datasets import GENERIC_DOCUMENTS, detect
    from grtool.corpus.readers import input_files, iter_records, open_streams, parse_line

    known = {"hotpotqa", "2wikimultihopqa", "musique", "morehopqa", "hotpotqa-wiki", "generic", "inline"}
    seen = set()
    root = request.getfixturevalue(source)
    for f in input_files(root):
        for stream in open_streams(f):
            _, first = next(iter_records(stream))
            shape = detect(parse_line(stream.name, "line 1", first) if isinstance(first, bytes) else first)
            dirs = f.relative_to(root).parts[:-1]
            want = "hotpotqa" if "variants" in dirs else next(p for p in reversed(dirs) if p in known)
            # the generic layout's documents file reads as generic documents
            read_as = "generic" if shape is not None and shape.dataset == GENERIC_DOCUMENTS else getattr(shape, "dataset", None)
            assert read_as == want, (f, shape)
            seen.add(want)
            break
    # the examples hold every layout; the real samples the four datasets
    assert seen == (known if source == "examples" else {"hotpotqa", "2wikimultihopqa", "musique", "morehopqa"})


@pytest.mark.real_data
def test_real_samples_manifest_says_what_each_file_was(ingested, shared_data):
    man = json.loads((ingested / "documents" / "_manifest.json").read_bytes())
    assert man["detected"] == json.loads((ingested / "questions" / "_manifest.json").read_bytes())["detected"]
    by_path = {e["path"]: e for e in man["detected"]}
    # files of one directory read alike are one entry per split
    assert by_path[str(shared_data / "hotpotqa")] == {
        "path": str(shared_data / "hotpotqa"),
        "files": 2,
        "dataset": "hotpotqa",
        "records": "questions",
        "split": "dev",
        "by": "detected",
        "unread": ["level"],
    }  # the keys no layout reads are named
    assert by_path[str(shared_data / SAMPLES["hotpotqa"][2])]["split"] == "train"
    assert by_path[str(shared_data / SAMPLES["hotpotqa"][3])]["dataset"] == "hotpotqa"
    assert by_path[str(shared_data / SAMPLES["morehopqa"][0])]["dataset"] == "morehopqa"
    assert {e["dataset"] for e in man["detected"]} == set(SAMPLES)


def _titled_corpus(path: Path) -> Path:
    """A corpus file in the layout HippoRAG ships for every dataset: a JSON array of {title, text}."""
    docs = [
        {"title": "Saltmarsh River", "text": "The Saltmarsh River flows into the North Sea near Kiel."},
        {"title": "Old Harbor Bridge", "text": "The Old Harbor Bridge crosses the Saltmarsh River."},
    ]
    path.write_text(json.dumps(docs, indent=4))
    return path


def test_a_list_of_titled_documents_needs_dataset(examples, cli, tmp_path):
    """Issue #26: a JSON list of {title, text} (HippoRAG's MuSiQue corpus file) was ingested as the HotpotQA
    Wikipedia dump, tagged hotpotqa, exit 0. Its dataset cannot be told from its shape: exit 2 naming the
    choices; with --dataset its documents carry that dataset, and the summary says what each file was read as."""
    corpus = _titled_corpus(tmp_path / "musique_corpus.json")
    hotpot = examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    proc = cli("corpus", "ingest", hotpot, corpus, "--out", tmp_path / "auto", check=2)
    assert no_spaces(f"{corpus}: cannot tell which dataset this is (looks like a list of {{title, text}} documents); pass --dataset hotpotqa|2wikimultihopqa|musique|morehopqa") in no_spaces(
        proc.stderr
    )
    assert _no_shards(tmp_path / "auto")

    out = tmp_path / "musique"
    proc = cli("corpus", "ingest", corpus, examples / "musique", "--dataset", "musique", "--out", out, "--json")
    report = json.loads(proc.stdout)  # the summary, as one JSON object: nothing else on stdout
    assert report["detected"] == [
        {"path": str(corpus), "dataset": "musique", "records": "documents", "by": "--dataset"},
        {"path": str(examples / "musique"), "files": 2, "dataset": "musique", "records": "questions", "split": "dev", "by": "--dataset"},
        {"path": str(examples / "musique" / "musique_ans_v1.0_train.example.jsonl"), "dataset": "musique", "records": "questions", "split": "train", "by": "--dataset"},
    ]
    assert report["questions_by_dataset"] == {"musique": 7} and report["out"] == str(out)
    docs = {d["title"]: d for d in read_table(out / "documents").to_pylist()}
    assert docs["Old Harbor Bridge"]["datasets"] == ["musique"] and docs["Saltmarsh River"]["datasets"] == ["musique"]
    man = json.loads((out / "documents" / "_manifest.json").read_bytes())
    assert man["detected"] == report["detected"] and report["documents"] == man["rows"]

    # --dataset never relabels another dataset's records
    proc = cli("corpus", "ingest", corpus, hotpot, "--dataset", "musique", "--out", tmp_path / "mixed", check=2)
    assert no_spaces(f"{hotpot}, record 1: these are HotpotQA questions, not musique (--dataset)") in no_spaces(proc.stderr)
    assert _no_shards(tmp_path / "mixed")


def test_questions_of_an_unclear_layout_need_dataset(examples, tmp_path):
    """A question with a [title, sentences] context but none of the keys only HotpotQA or only 2Wiki have."""
    from grtool.corpus.ingest import ingest
    from grtool.errors import InputError

    record = json.loads((examples / "2wikimultihopqa" / "dev.example.json").read_text())[0]
    for key in ("evidences", "supporting_facts"):
        del record[key]
    odd = tmp_path / "odd_dev.json"
    odd.write_text(json.dumps([record]))
    with pytest.raises(
        InputError,
        match=r"cannot tell which dataset this is \(looks like questions with a \[title, "
        r"sentences\] context\); pass --dataset hotpotqa\|2wikimultihopqa",
    ):
        ingest([odd], tmp_path / "o1")
    with pytest.raises(InputError, match="not hotpotqa-wiki"):
        ingest([odd], tmp_path / "o2", dataset="hotpotqa-wiki")
    report = ingest([odd], tmp_path / "o3", dataset="2wikimultihopqa")
    assert report.questions_by_dataset == {"2wikimultihopqa": 1}
    assert report.detected == [{"path": str(odd), "dataset": "2wikimultihopqa", "records": "questions", "split": "dev", "by": "--dataset"}]
