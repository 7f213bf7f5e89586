"""The triple parser on the shapes models really return, and the docid rendering."""

from __future__ import annotations

import pytest

from grtool.triples.parse import normalize, parse_line, parse_output, render_docid

PARIS = ("Paris", "capital of", "France")
SEINE = ("Paris", "lies on", "Seine")
BORN = ("Tim Bergling", "was born on", "September 8, 1989")

SHAPES = [
    ("json object", '{"triples": [["Paris", "capital of", "France"], ["Paris", "lies on", "Seine"]]}', [PARIS, SEINE]),
    ("json array of arrays", '[["Paris", "capital of", "France"], ["Paris", "lies on", "Seine"]]', [PARIS, SEINE]),
    (
        "json array of objects",
        '[{"head": "Paris", "relation": "capital of", "tail": "France"}, {"subject": "Paris", "predicate": "lies on", "object": "Seine"}]',
        [PARIS, SEINE],
    ),
    ("json lines", '["Paris", "capital of", "France"]\n["Paris", "lies on", "Seine"]', [PARIS, SEINE]),
    ("json strings with pipes", '{"triples": ["Paris | capital of | France", "Paris | lies on | Seine"]}', [PARIS, SEINE]),
    ("parenthesized lines", "(Paris, capital of, France)\n(Paris, lies on, Seine).", [PARIS, SEINE]),
    ("pipe lines", "Paris | capital of | France\nParis | lies on | Seine", [PARIS, SEINE]),
    ("numbered list", "1. Paris, capital of, France\n2) Paris, lies on, Seine.", [PARIS, SEINE]),
    ("bulleted list", "- (Paris, capital of, France)\n* Paris | lies on | Seine\n• Paris, capital of, France", [PARIS, SEINE]),
    ("markdown table", "| Head | Relation | Tail |\n|---|---|---|\n| Paris | capital of | France |\n| Paris | lies on | Seine |", [PARIS, SEINE]),
    (
        "code fence with chat around it",
        'Sure! Here are the triples you asked for:\n```json\n{"triples": [["Paris", "capital of", "France"]]}\n```\nLet me know if you need more.',
        [PARIS],
    ),
    ("chatty line list", "Here are the triples:\n1. (Paris, capital of, France)\nI hope this helps, good luck, bye.", [PARIS]),
    ("comma inside the tail", "(Tim Bergling, was born on, September 8, 1989)", [BORN]),
    ("comma inside the tail, json", '[["Tim Bergling", "was born on", "September 8, 1989"]]', [BORN]),
    ("quoted csv with comma in head", '"Washington, D.C.", "capital of", "United States"', [("Washington, D.C.", "capital of", "United States")]),
    ("arrows", "Paris -> capital of -> France", [PARIS]),
    ("labels", "Triple 1: Paris; capital of; France", [PARIS]),
    (
        "normalization",
        "  (\"Paris\" ,  capital   of ,  “France”.)\n- 'Paris' | lies on | Seine;",
        [PARIS, SEINE],
    ),
    ("dedup is case-insensitive", "(Paris, capital of, France)\n(paris, Capital of, FRANCE)", [PARIS]),
    ("abbreviation keeps its dot", "- Tim, moved to, the U.S.", [("Tim", "moved to", "the U.S.")]),
    ("bracketed line, not json", "[Paris, capital of, France]\n[Paris, lies on, Seine]", [PARIS, SEINE]),
    ("parenthesized quoted line", '("Paris", "capital of", "France")', [PARIS]),
    ("json number as a part", '[["Avicii", "born in", 1989]]', [("Avicii", "born in", "1989")]),
    # not JSON: read as a line, then rejected: a bracket cannot live inside a docid (tests/docid/test_docid_syntax.py)
    ("citation number is not json", "[1] Paris | capital of | France", []),
]


@pytest.mark.parametrize("name,text,expected", SHAPES, ids=[s[0] for s in SHAPES])
def test_output_shapes(name: str, text: str, expected: list[tuple[str, str, str]]) -> None:
    parsed = parse_output(text, "stop")
    assert parsed.triples == expected
    assert not parsed.truncated


# Output cut by the length limit: (name, text, the complete triples that must be kept).
TRUNCATED = [
    ("salvage keeps a number part", '{"triples": [["Avicii", "born in", 1989], ["Avicii", "died in", 20', [("Avicii", "born in", "1989")]),
    ("cut last line is dropped", "(Paris, capital of, France)\nParis, lies on, Sei", [PARIS]),
    ("cut last pipe line is dropped", "Paris | capital of | France\nParis | lies on | Se", [PARIS]),
    ("complete last line is kept", "(Paris, capital of, France)\n(Paris, lies on, Seine)\n", [PARIS, SEINE]),
    ("closed fence keeps its last line", "```\nParis | capital of | France\nParis | lies on | Seine\n```", [PARIS, SEINE]),
    ("open fence drops its cut line", "```\nParis | capital of | France\nParis | lies on | Se", [PARIS]),
]


@pytest.mark.parametrize("name,text,expected", TRUNCATED, ids=[s[0] for s in TRUNCATED])
def test_truncated_shapes(name: str, text: str, expected: list[tuple[str, str, str]]) -> None:
    parsed = parse_output(text, "length")
    assert parsed.triples == expected and parsed.truncated


def test_only_a_truncated_line_is_dropped() -> None:
    # The same text without the length limit: the last line is complete.
    assert parse_output("(Paris, capital of, France)\nParis, lies on, Seine", "stop").triples == [PARIS, SEINE]


# JSON-shaped outputs without a complete triple: a parse failure, never raw JSON split on commas.
JSON_FAILURES = [
    ("truncated array of arrays", '{"triples": [["Paris", "capital of", "Fr', "length"),
    ("truncated array of objects", '[{"head": "Paris", "relation": "capital of", "tail": "Fr', "length"),
    ("object without triples", '{"triples": [], "note": "none", "count": 0}', "stop"),
    ("four parts", '[["Paris","capital of","France",0.9]]', "stop"),
    ("four parts, several lines", '[["Paris","capital of","France",0.9],\n ["Paris","lies on","Seine",0.8]]', "stop"),
    ("chat, then truncated json", 'Here you go:\n{"triples": [["Paris", "capital of", "Fr', "length"),
    ("truncated before the first part", '[\n  ["Par', "length"),
]


@pytest.mark.parametrize("name,text,finish", JSON_FAILURES, ids=[s[0] for s in JSON_FAILURES])
def test_json_shaped_output_never_goes_to_the_line_parser(name: str, text: str, finish: str) -> None:
    parsed = parse_output(text, finish)
    assert parsed.triples == [] and parsed.failed and parsed.candidates == 0


def test_truncated_json_keeps_every_complete_triple() -> None:
    text = '```json\n{"triples": [["Paris", "capital of", "France"], ["Paris", "lies on", "Seine"], ["Paris", "has mayor", "Anne Hi'
    parsed = parse_output(text, "length")
    assert parsed.triples == [PARIS, SEINE]
    assert parsed.truncated and not parsed.failed


def test_truncated_object_list() -> None:
    text = '[{"head": "Paris", "relation": "capital of", "tail": "France"}, {"head": "Paris", "relation": "lies'
    parsed = parse_output(text, "length")
    assert parsed.triples == [PARIS] and parsed.truncated


def test_truncated_before_the_first_triple_is_a_failure() -> None:
    parsed = parse_output('{"triples": [["Paris", "capi', "length")
    assert parsed.triples == [] and parsed.failed and parsed.truncated


def test_counts_empty_parts_and_duplicates() -> None:
    parsed = parse_output('[["Paris", "capital of", "France"], ["", "x", "y"], ["Paris", " capital of ", "France."], [" ", "\\"\\"", "z"]]')
    assert parsed.triples == [PARIS]
    assert parsed.candidates == 4 and parsed.duplicates == 1
    assert parsed.empty_parts == [("", "x", "y"), ("", "", "z")]


@pytest.mark.parametrize("text", ["", "I could not find any triples in this document.", "Here are the triples:", "{}", "[1, 2]"])
def test_no_triples(text: str) -> None:
    parsed = parse_output(text)
    assert parsed.triples == [] and parsed.failed


def test_prose_lines_are_not_triples() -> None:
    assert parse_line("Sure, here are the triples, as you asked.") is None
    assert parse_line("The document describes a football match, its venue, and the final score of the game in detail, briefly.") is None
    assert parse_line("Note:") is None


def test_normalize() -> None:
    assert normalize('  "Paris"  ') == "Paris"
    assert normalize("‘Le Monde’.") == "Le Monde"
    assert normalize("Paris,;") == "Paris"
    assert normalize("Acme Inc.") == "Acme Inc."
    assert normalize("a   b\n c") == "a b c"
    assert normalize('"  "') == ""


def test_render_docid() -> None:
    assert render_docid(PARIS) == "<docid_start>Paris, capital of, France<docid_end>"
    assert render_docid(PARIS, "[", "]") == "[Paris, capital of, France]"
