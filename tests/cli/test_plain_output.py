"""One printer for plain output: control characters from the data and the paths are escaped in every table, line
and log that `show`, `corpus stats`, `status` and `validate` write off a terminal (piped, as in a log or CI).

The data is the 2WikiMultihopQA example with a title holding an ANSI colour code, a carriage return and a bell,
ingested into a directory whose name holds a newline."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_cli

TITLE = "Steven Spielberg"
HOSTILE = "Steven \x1b[31mSpielberg\r\x07"
RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]")  # any control character but the newline that ends a line


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    from grtool.store.stage import read_table
    from grtool.triples.evidence import write_evidence_stage

    root = tmp_path_factory.mktemp("plain")
    text = (EXAMPLES / "2wikimultihopqa" / "data_ids_dev.example.json").read_text()
    assert json.dumps(TITLE) in text
    (root / "dev.json").write_text(text.replace(json.dumps(TITLE), json.dumps(HOSTILE)))  # in context, supporting facts, evidence
    d = root / "run\nx"
    run_cli("-q", "corpus", "ingest", root / "dev.json", "--out", d / "corpus")
    # the evidences naming the title are rejected (a docid holds no control character): one clean triple of its document
    [spielberg] = [row["doc_id"] for row in read_table(d / "corpus" / "documents").to_pylist() if row["title"] == HOSTILE]
    triple = {"doc_id": spielberg, "idx": 0, "head": TITLE, "relation": "place of birth", "tail": "Cincinnati"}
    write_evidence_stage(d / "corpus", d / "triples", [{**triple, "docid": f"<docid_start>{TITLE}, place of birth, Cincinnati<docid_end>"}])
    return d


def _piped(*args: object, code: int = 0) -> bytes:
    proc = subprocess.run([sys.executable, "-m", "grtool", *map(str, args)], capture_output=True)
    assert proc.returncode == code, proc.stderr.decode(errors="replace")
    return proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "command, code",
    [
        (["show", "{run}/triples", "--limit", "0"], 0),  # the document line names the title
        (["corpus", "stats", "{run}/corpus"], 0),
        (["status", "{run}"], 0),
        (["validate", "{run}"], 0),
    ],
)
def test_piped_output_holds_no_raw_control_character(run: Path, command: list[str], code: int) -> None:
    out = _piped(*(c.replace("{run}", str(run)) for c in command), code=code)
    # before: the path's newline broke its line in two (a timestamp and "x/..." on the next), and show wrote ESC
    assert not RAW_CONTROL.search(out), out
    assert not re.search(rb"run\n", out), out
    if command[0] == "show":
        assert b"Steven \\x1b[31mSpielberg\\r\\x07" in out, out  # the title shown, escaped, not dropped
    else:
        assert b"run\\nx" in out, out  # the path, escaped, on one line


def test_a_log_record_and_an_error_are_escaped_too(run: Path, tmp_path: Path) -> None:
    # a stage's summary line and warning (the log) and an error, each naming the path
    out = _piped("corpus", "ingest", EXAMPLES / "2wikimultihopqa" / "data_ids_dev.example.json", "--out", run.parent / "again\ny")
    assert not RAW_CONTROL.search(out) and b"again\\ny" in out and not re.search(rb"again\n", out), out
    out = _piped("show", run / "nothing", code=2)
    assert not RAW_CONTROL.search(out) and b"run\\nx/nothing" in out, out


def test_a_pipeline_note_keeps_its_lines(tmp_path: Path, write_pipeline) -> None:
    """The pipeline file's `note` (the demo's closing words) is printed line by line, not as one line of `\\n`s."""
    hotpot = EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
    path = write_pipeline([{"name": "ingest", "run": "corpus ingest", "args": [str(hotpot)], "options": {"out": "{out}/corpus"}}],
                          out=str(tmp_path / "run"), note="First line of the note.\nSecond line.\n")  # fmt: skip
    err = run_cli("pipeline", "run", path).stderr
    assert re.search(r"First line of the note\.\n(\S+ \S+ )?Second line\.", err) and "\\n" not in err, err[-1000:]
