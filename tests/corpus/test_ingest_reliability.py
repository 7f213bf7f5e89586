"""Reliability of `corpus ingest` (issue 17): fingerprints, bad output paths, empty inputs, output inside
an input directory, strictness on resume, empty --out, scalar ids, whole-file JSON objects."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from grtool.corpus.synthetic import write_hotpot_array
from grtool.store.fingerprints import _legacy_fingerprint
from grtool.store.stage import read_table


def one_line(text: str) -> str:
    return "".join(text.split())


def _no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def _manifest(out: Path, table: str = "documents") -> dict:
    return json.loads((out / table / "_manifest.json").read_bytes())


# ------------------------------------------------------------------------------- 3: fingerprints


def test_a_same_size_edit_in_the_middle_of_a_big_input_is_detected(tmp_path, cli):
    src = write_hotpot_array(tmp_path / "hotpot_train_v1.1.json", 1500)
    size = src.stat().st_size
    assert size > 3 << 20  # more than the first and last MiB the old fingerprint hashed
    out = tmp_path / "out"
    cli("corpus", "ingest", src, "--out", out)
    data = bytearray(src.read_bytes())
    middle = data.index(b"ka", size // 2)  # inside a pseudo-word of a sentence
    data[middle : middle + 2] = b"KA"
    src.write_bytes(bytes(data))
    assert src.stat().st_size == size
    proc = cli("corpus", "ingest", src, "--out", out, check=2)
    assert "changed" in proc.stderr and "--overwrite" in one_line(proc.stderr)
    cli("corpus", "ingest", src, "--out", out, "--overwrite")
    texts = read_table(out / "documents").column("text").to_pylist()
    assert any("KA" in t for t in texts)


def test_relative_and_absolute_paths_of_one_input_are_the_same_input(examples, tmp_path):
    src = tmp_path / "data" / "hotpot_dev_distractor_v1.json"
    src.parent.mkdir()
    src.write_bytes((examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_bytes())
    cmd = [sys.executable, "-m", "grtool", "corpus", "ingest"]
    first = subprocess.run([*cmd, "data/hotpot_dev_distractor_v1.json", "--out", "out"], cwd=tmp_path, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    again = subprocess.run([*cmd, str(src), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert "alreadycomplete" in one_line(again.stderr)
    assert _manifest(tmp_path / "out")["inputs"][0]["path"] == str(src.resolve())


def test_an_output_of_the_earlier_sampled_fingerprint_still_resumes(examples, tmp_path, cli):
    src = tmp_path / "hotpot_dev_distractor_v1.json"
    src.write_bytes((examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_bytes())
    out = tmp_path / "out"
    cli("corpus", "ingest", src, "--out", out)
    for table in ("documents", "questions"):  # rewrite the manifests the way earlier versions fingerprinted
        m = _manifest(out, table)
        m["inputs"] = [{"path": str(src), **_legacy_fingerprint(src)}]
        (out / table / "_manifest.json").write_text(json.dumps(m))
    proc = cli("corpus", "ingest", src, "--out", out)
    assert "alreadycomplete" in one_line(proc.stderr)
    src.write_bytes(src.read_bytes().replace(b" the ", b" THE ", 1))  # still compared, by the old sampled hash
    cli("corpus", "ingest", src, "--out", out, check=2)


# ------------------------------------------------------------------------ 6 and 10: bad --out paths


def test_out_naming_an_existing_file_is_one_line_exit_2(examples, cli, tmp_path):
    target = tmp_path / "afile"
    target.write_text("keep me")
    src = examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    proc = cli("corpus", "ingest", src, "--out", target, check=2)
    _no_traceback(proc)
    assert one_line(f"--out {target}: names an existing file grtool did not write") in one_line(proc.stderr)
    assert target.read_text() == "keep me"
    corpus = tmp_path / "corpus"
    cli("corpus", "ingest", src, "--out", corpus)
    proc = cli("triples", "extract", corpus, "--out", target, "--no-cache", check=2)
    _no_traceback(proc)
    assert "is a file, not a directory" in proc.stderr or "names an existing file" in proc.stderr


def test_non_utf8_input_names_are_read_and_output_names_are_one_line_exit_2(examples, cli, tmp_path):
    """Inputs are read under any name the file system holds (issue #36); grtool writes only UTF-8 names, since its
    records name its outputs in JSON."""
    bad_name = os.fsdecode(b"hotpot_dev_\xff.json")
    bad = tmp_path / bad_name
    bad.write_bytes((examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_bytes())
    cli("corpus", "ingest", bad, "--out", tmp_path / "o1")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / bad_name).write_bytes(bad.read_bytes())
    cli("corpus", "ingest", folder, "--out", tmp_path / "o2")
    assert "\\xff" in (tmp_path / "o2" / "documents" / "_manifest.json").read_text()  # recorded escaped
    proc = cli("corpus", "ingest", examples / "hotpotqa", "--out", tmp_path / os.fsdecode(b"out\xfe"), check=2)
    _no_traceback(proc)
    assert "not valid UTF-8" in proc.stderr


def test_empty_out_is_refused(examples, tmp_path):
    src = examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    for args in (["corpus", "ingest", str(src)], ["triples", "extract", str(tmp_path)]):
        proc = subprocess.run([sys.executable, "-m", "grtool", *args, "--out", ""], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        _no_traceback(proc)
        assert "--out is empty" in proc.stderr
        assert not list(tmp_path.iterdir())  # nothing written into the current directory


# ------------------------------------------------------------------------------- 7: empty inputs


def _empties(root: Path) -> list[Path]:
    root.mkdir()
    files = {
        "zero_dev.json": b"",
        "blank_dev.json": b"  \n\n\t \n",
        "array_dev.json": b"[ ]\n",
        "nothing_dev.json.gz": gzip.compress(b""),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    return [root / name for name in files]


def test_an_empty_input_alone_is_exit_2_naming_it(cli, tmp_path):
    for f in _empties(tmp_path / "in"):
        proc = cli("corpus", "ingest", f, "--out", tmp_path / f"out-{f.name}", check=2)
        _no_traceback(proc)
        assert one_line(f"{f}: is empty") in one_line(proc.stderr) and "--allow-empty" in proc.stderr
        assert not list((tmp_path / f"out-{f.name}").glob("*/part-*.parquet"))
    f = tmp_path / "in" / "zero_dev.json"
    cli("corpus", "ingest", f, "--out", tmp_path / "accepted", "--allow-empty")
    assert _manifest(tmp_path / "accepted")["rows"] == 0


def test_empty_inputs_beside_others_are_a_warning_and_a_counter(examples, cli, tmp_path):
    empties = _empties(tmp_path / "in")
    src = examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    out = tmp_path / "out"
    proc = cli("corpus", "ingest", src, *empties, "--out", out)
    for f in empties:
        assert one_line(f"{f}: empty input") in one_line(proc.stderr)
    for table in ("documents", "questions"):
        m = _manifest(out, table)
        assert m["counters"]["extra"]["empty_inputs"] == 4
        assert m["empty_inputs"] == [str(f) for f in empties]
    assert _manifest(out, "questions")["rows"] == 3
    cli("validate", out)
    proc = cli("corpus", "ingest", src, *empties, "--out", out)  # a resumed (finished) run still says so
    assert one_line(f"{empties[0]}: empty input") in one_line(proc.stderr)


# ------------------------------------------------------------------- 8: --out inside an input directory


def test_out_inside_the_input_directory_is_not_read_as_input(examples, cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "hotpot_dev_distractor_v1.json").write_bytes((examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_bytes())
    out = data / "out"
    cli("corpus", "ingest", data, "--out", out)
    first = read_table(out / "questions")
    proc = cli("corpus", "ingest", data, "--out", out)
    assert "alreadycomplete" in one_line(proc.stderr)
    cli("corpus", "ingest", data, "--out", out, "--overwrite")
    assert read_table(out / "questions").equals(first)
    assert _manifest(out)["inputs"][0]["files"] == 1
    cli("validate", out)
    # the input directory itself as the output directory: its own tables are still not input
    cli("corpus", "ingest", data, "--out", data)
    cli("corpus", "ingest", data, "--out", data, "--overwrite")
    assert read_table(data / "questions").equals(first)


# ------------------------------------------------------------------------------ 9: --strict on resume


def test_strict_added_on_resume_is_a_changed_parameter(examples, cli, tmp_path):
    lines = (examples / "musique" / "musique_ans_v1.0_dev.example.jsonl").read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["question"]
    bad = tmp_path / "musique_dev.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(broken)]) + "\n")
    out = tmp_path / "out"
    cli("corpus", "ingest", bad, "--out", out)
    proc = cli("corpus", "ingest", bad, "--out", out, "--strict", check=2)
    assert "parameterstrict(Nonebefore,Truenow)" in one_line(proc.stderr)
    proc = cli("corpus", "ingest", bad, "--out", out, "--strict", "--overwrite", check=2)
    assert one_line(f"{bad}, line 2: missing field 'question'") in one_line(proc.stderr)


# ------------------------------------------------------------------------------------------ smaller


def test_integer_ids_are_accepted_as_strings(examples, cli, tmp_path):
    records = json.loads((examples / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_text())
    records[0]["_id"] = 123456
    records[1]["_id"] = 7.0
    records[2]["_id"] = ["not", "scalar"]
    src = tmp_path / "vendored_dev.json"
    src.write_text(json.dumps(records))
    out = tmp_path / "out"
    cli("corpus", "ingest", src, "--out", out)
    assert read_table(out / "questions").column("qid").to_pylist() == ["123456", "7"]
    assert _manifest(out, "questions")["counters"]["rejected"] == {"field '_id' has the wrong type": 1}


def test_a_whole_file_json_object_is_named(cli, tmp_path):
    corpus = {"Title A": ["First sentence.", " Second."], "Title B": ["Other."]}
    pretty = tmp_path / "corpus_dev.json"
    pretty.write_text(json.dumps(corpus, indent=2))
    proc = cli("corpus", "ingest", pretty, "--out", tmp_path / "o1", check=2)
    msg = " ".join(proc.stderr.split())
    assert "one JSON object spread over several lines" in msg and "'Title A': list" in msg and "not valid JSON" not in msg
    flat = tmp_path / "flat_dev.json"
    flat.write_text(json.dumps(corpus))
    proc = cli("corpus", "ingest", flat, "--out", tmp_path / "o2", check=2)
    assert "a mapping of titles to sentence lists" in " ".join(proc.stderr.split())
