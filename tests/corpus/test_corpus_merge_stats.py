"""corpus merge (union with deduplication) and corpus stats (the dataset table), through the real CLI."""

from __future__ import annotations

import json

import orjson

from grtool.store.stage import read_table


def _ingest(cli, path, out):
    cli("corpus", "ingest", path, "--out", out)
    return out


def test_merge_dedups_documents_and_unites_datasets(examples, cli, tmp_path):
    wiki2 = _ingest(cli, examples / "2wikimultihopqa", tmp_path / "2wiki")
    more = _ingest(cli, examples / "morehopqa", tmp_path / "more")
    out = tmp_path / "merged"
    report = json.loads(cli("corpus", "merge", wiki2, more, "--out", out, "--json").stdout)  # the summary as JSON
    cli("validate", out)
    a, b = read_table(wiki2 / "documents").to_pylist(), read_table(more / "documents").to_pylist()
    merged = {r["doc_id"]: r for r in read_table(out / "documents").to_pylist()}
    assert report["documents"] == len(merged) and report["documents_merged"] == len(a) + len(b) - len(merged)
    assert report["questions"] == read_table(out / "questions").num_rows and report["rejected"] == {}
    assert set(merged) == {r["doc_id"] for r in a} | {r["doc_id"] for r in b}
    shared = {r["doc_id"] for r in a} & {r["doc_id"] for r in b}
    assert shared and all(merged[d]["datasets"] == ["2wikimultihopqa", "morehopqa"] for d in shared)
    man = json.loads((out / "documents" / "_manifest.json").read_bytes())
    assert man["counters"]["merged"] == len(shared)
    questions = read_table(out / "questions").to_pylist()
    assert [q["qid"] for q in questions] == [q["qid"] for q in read_table(wiki2 / "questions").to_pylist()] + [q["qid"] for q in read_table(more / "questions").to_pylist()]


def test_merge_rejects_repeated_qids_and_folds_repeated_documents(examples, cli, tmp_path):
    run = _ingest(cli, examples / "musique", tmp_path / "m")
    out = tmp_path / "twice"
    cli("corpus", "merge", run, run, "--out", out)
    q = json.loads((out / "questions" / "_manifest.json").read_bytes())
    d = json.loads((out / "documents" / "_manifest.json").read_bytes())
    n_q, n_d = read_table(run / "questions").num_rows, read_table(run / "documents").num_rows
    assert q["rows"] == n_q and q["counters"]["rejected"] == {"duplicate qid": n_q}
    assert d["rows"] == n_d and d["counters"]["merged"] == n_d
    cli("validate", out)


def test_merge_to_stdout_and_of_a_documents_only_corpus(examples, cli, tmp_path):
    wiki = _ingest(cli, examples / "hotpotqa-wiki", tmp_path / "wiki")
    assert not (wiki / "questions").exists()  # the dump has no questions
    hotpot = _ingest(cli, examples / "hotpotqa", tmp_path / "hotpot")
    proc = cli("corpus", "merge", wiki, hotpot, "--out", "-")
    rows = [orjson.loads(x) for x in proc.stdout.splitlines()]
    docs = [r for r in rows if r["_table"] == "documents"]
    assert len({r["doc_id"] for r in docs}) == len(docs)
    wiki_ids = {r["doc_id"] for r in read_table(wiki / "documents").to_pylist()}
    hotpot_ids = {r["doc_id"] for r in read_table(hotpot / "documents").to_pylist()}
    assert {r["doc_id"] for r in docs} == wiki_ids | hotpot_ids and wiki_ids & hotpot_ids
    assert sum(r["_table"] == "questions" for r in rows) == 13


def test_merge_reads_an_ingest_stream_on_stdin(examples, cli, tmp_path):
    """`corpus ingest ... --out - | corpus merge - other --out dir` equals merging the two directories."""
    musique = _ingest(cli, examples / "musique", tmp_path / "musique")
    wiki = _ingest(cli, examples / "2wikimultihopqa", tmp_path / "2wiki")
    stream = cli("corpus", "ingest", examples / "2wikimultihopqa", "--out", "-").stdout
    cli("corpus", "merge", "-", musique, "--out", tmp_path / "piped", input=stream)
    cli("corpus", "merge", wiki, musique, "--out", tmp_path / "dirs")
    cli("validate", tmp_path / "piped")
    for table in ("documents", "questions"):
        assert read_table(tmp_path / "piped" / table).to_pylist() == read_table(tmp_path / "dirs" / table).to_pylist()
    proc = cli("corpus", "merge", "-", "--out", tmp_path / "bad", input='{"_table": "documents", "title": "x"}\n', check=2)
    assert "<stdin>, line 1" in proc.stderr and "doc_id" in proc.stderr


def test_stats_table_json_and_plot(examples, cli, tmp_path):
    run = _ingest(cli, examples, tmp_path / "all")
    proc = cli("corpus", "stats", run, "--json", "--plot", tmp_path / "plot" / "stats.png")
    stats = json.loads(proc.stdout)
    groups = {(g["dataset"], g["split"]): g for g in stats["groups"]}
    assert sum(g["questions"] for g in groups.values()) == stats["questions_total"] == 47
    assert groups[("generic", "unknown")]["questions"] == 12  # examples/data/inline: own data before `corpus split`
    assert {k[0]: g["questions"] for k, g in groups.items() if k[1] == "train"} == {"hotpotqa": 6, "2wikimultihopqa": 3, "musique": 3, "generic": 1}
    musique = groups[("musique", "dev")]
    assert musique["questions"] == 4 and musique["answerable_share"] == 0.75
    assert musique["hops"] == {"2": 3, "3": 1}
    assert musique["gold_per_question"] == {"mean": 1.75, "min": 0, "max": 3}
    wiki = groups[("2wikimultihopqa", "dev")]
    assert wiki["hops"] == {"2": 4, "4": 1} and wiki["gold_per_question"]["max"] == 4  # one of them the HF layout's
    more = groups[("morehopqa", "test")]
    assert more["hops"] == {"2": 2, "3": 2} and more["gold_per_question"]["mean"] == 2
    # the generic layout's questions: split from the file name or from the record, hops from the gold list
    assert groups[("generic", "dev")]["hops"] == {"2": 2} and groups[("generic", "train")]["questions"] == 1
    docs = read_table(run / "documents").to_pylist()
    assert stats["documents"]["total"] == len(docs)
    assert stats["documents"]["by_dataset"]["musique"] == sum("musique" in d["datasets"] for d in docs)
    assert (tmp_path / "plot" / "stats.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = cli("corpus", "stats", run)
    assert "morehopqa" in table.stderr and "2wikimultihopqa" in table.stderr
