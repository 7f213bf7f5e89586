"""grtool.docid: markers, render, parse, the one normalize rule, flip — and the stages agreeing on it.

The property test writes a small triples stage, then asks three consumers whether each random spelling of a
docid names a stored triple: the filters' docid-exists rule (polars hashes), eval recall and the KTO label
(the export lookup). They must agree on every spelling, and with :func:`grtool.docid.normalize`.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grtool.docid import (
    BRACKETS,
    BROKEN,
    SPECIAL,
    Markers,
    Span,
    cut,
    flip,
    flip_key,
    normalize,
    normalize_expr,
    parse,
    render,
    scan,
    triple_key,
)
from grtool.export.kto import kto_label
from grtool.vocab.readers import DocidIndex, Question, Response
from grtool.evaluation.recall import score_response
from grtool.docid.lookup import docid_hashes
from grtool.docid.lookup_files import open_lookup

SPACES = [" ", "  ", "\t", "\n", "\u00a0", "\u3000", "\x1f"]

# Parts: words with letters (some with a comma inside, as in "Ana, mon amour" or "July 31, 2012").
WORD = st.text(alphabet="abcXYZéß0", min_size=1, max_size=4)
PART = st.lists(WORD, min_size=1, max_size=3).map(" ".join) | st.tuples(WORD, WORD).map(", ".join)
TRIPLE = st.tuples(PART, PART, PART)


def test_render_and_markers():
    assert render(("Paris", "capital of", "France")) == "<docid_start>Paris, capital of, France<docid_end>"
    assert render(("Paris", "capital of", "France"), BRACKETS) == "[Paris, capital of, France]"
    assert SPECIAL.unwrap(render(("a", "b", "c"))) == "a, b, c"
    assert SPECIAL.unwrap("a, b, c") is None
    assert flip(("a", "b", "c")) == ("c", "b", "a")


def test_normalize_rule():
    assert normalize("Moza bint Nasser ,  place of birth,Al Khor") == "Moza bint Nasser,place of birth,Al Khor"
    assert normalize(" a\t b , c ,\u00a0d ") == "a b,c,d"
    assert normalize("Moza, X, Y") != normalize("moza, X, Y")  # case is kept
    assert triple_key("Ana, mon amour", "director", " Călin  Peter Netzer") == "Ana,mon amour,director,Călin Peter Netzer"
    assert flip_key("a", "b", "c") == "c,b,a"


def test_scan_positions_and_problems():
    text = "x <docid_start>a, b, c<docid_end> y <docid_start>oops<docid_end> <docid_end>"
    spans = scan(text)
    assert [(text[s.start : s.end], s.problem) for s in spans] == [
        ("<docid_start>a, b, c<docid_end>", None),
        ("<docid_start>oops<docid_end>", "not-a-triple"),
        ("<docid_end>", "unopened"),
    ]
    parsed = parse("see [a, b, c] and <docid_start>d ,e,f<docid_end>")
    assert parsed.docids == ["d,e,f", "a,b,c"] and parsed.malformed == 0
    bracket = parsed.spans[1]
    assert "see [a, b, c] and"[bracket.start : bracket.end] == "[a, b, c]"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab, ,") + [c for c in SPACES if len(c) == 1]), max_size=20))
def test_polars_normalize_is_normalize(text):
    got = pl.DataFrame({"x": [text]}).select(normalize_expr(pl.col("x"))).item()
    assert got == normalize(text)


@settings(max_examples=300, deadline=None)
@given(TRIPLE, st.sampled_from(SPACES))
def test_triple_key_is_normalize_of_the_rendered_text(triple, space):
    h, r, t = (space + p + space for p in triple)
    assert triple_key(h, r, t) == normalize(f"{h}, {r}, {t}")


def _respell(draw, part: str) -> str:
    """The same part with other whitespace: every space a random run, random padding at both ends."""
    words = part.split(" ")
    out = words[0]
    for w in words[1:]:
        out += draw(st.sampled_from(SPACES)) + w
    return draw(st.sampled_from(["", " ", "\t"])) + out + draw(st.sampled_from(["", " ", "  "]))


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """A triples stage of a few fixed triples (the random spellings are checked against them)."""
    from sample_helpers import write_stage

    from grtool.store.schemas import TRIPLES

    root = tmp_path_factory.mktemp("docid") / "triples"
    rows = [{"doc_id": f"d{i}", "idx": 0, "head": h, "relation": r, "tail": t, "docid": render((h, r, t))} for i, (h, r, t) in enumerate(STORED)]
    write_stage(root, "triples", TRIPLES, rows)
    return open_lookup(root), DocidIndex.build(root)


STORED = [
    ("Ana, mon amour", "director", "Călin Peter Netzer"),
    ("Moza bint Nasser", "place of birth", "Al Khor"),
    ("Al Khor", "country", "Qatar"),
    ("a", "b", "c"),
    ("X  Y", "p ,q", "Z"),  # stored with odd spacing: a key forgives it too
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_filters_recall_and_kto_agree_on_every_spelling(stage, data):
    triples, docids = stage
    if data.draw(st.booleans()):
        triple = data.draw(st.sampled_from(STORED))
    else:
        triple = data.draw(TRIPLE)
    if data.draw(st.booleans()):
        triple = flip(triple)
    if data.draw(st.booleans()):  # a case change makes it another docid (the rule keeps case)
        triple = tuple(p.swapcase() for p in triple)
    spelled = tuple(_respell(data.draw, p) for p in triple)
    inner = f"{spelled[0]}{data.draw(st.sampled_from(SPACES))},{data.draw(st.sampled_from(['', ' ', '  ']))}{spelled[1]},{data.draw(st.sampled_from(['', ' ', chr(9)]))}{spelled[2]}"
    key = normalize(inner)
    expected = {triple_key(*s) for s in STORED} | {flip_key(*s) for s in STORED}

    # filters: the docids column as `chains synthesize` writes it, markers included
    markers = Markers()
    resolved = triples.resolve(docid_hashes(pa.array([markers.wrap(inner)]), markers))
    in_filters = resolved.triple[0] != 0

    # recall and KTO: a response with the docid in special tokens
    question = Question("q", "test", "?", ("d0",), True)
    score = score_response(Response(1, "q", f"so {markers.wrap(inner)}."), question, docids)
    in_recall = score.hallucinated == 0 and score.docids == 1
    found_docs = {f"d{STORED.index(s)}" for s in STORED if key in (triple_key(*s), flip_key(*s))}
    assert score.retrieved == found_docs
    label = kto_label(score, 0.5)
    assert label is (True if found_docs == {"d0"} else False)

    assert in_filters == in_recall == (key in expected)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<docid_start>", "<docid_end>", "a, b, c", "x", " ", ",", "[", "]"]), max_size=10).map("".join))
def test_cut_is_scan_without_positions(text):
    outside, inners, broken = cut(text)
    spans = scan(text)
    first_broken = next((s for s in spans if s.problem in BROKEN), None)
    assert broken == first_broken
    if broken is None:
        assert inners == [s.inner for s in spans]
        pieces = [text[a.end : b.start] for a, b in zip([Span(0, 0, "")] + spans, spans + [Span(len(text), len(text), "")])]
        assert outside == pieces
    else:
        assert (outside, inners) == ([text], [])
