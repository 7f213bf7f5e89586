"""The triple checks of `triples extract` (grtool/triples/grounding.py) on real documents, no model."""

from __future__ import annotations

import json

import pytest

from grtool.store.records import Counters
from grtool.triples.grounding import DocumentTokens, TripleChecks, content_tokens, drop_shares, grounded, tokens
from grtool.triples.prompt import load_prompt

EXAMPLE_TRIPLES = [t for ex in load_prompt().examples for t in ex.triples]


def _paragraphs(path, titles: set[str]) -> dict[str, str]:
    out = {}
    for rec in json.loads(path.read_text()):
        for title, sentences in rec["context"]:
            if title in titles:
                out[title] = "".join(sentences)
    return out


@pytest.fixture
def film_docs(examples):
    """Real MoreHopQA paragraphs: 'Jaws (film)' and 'Steven Spielberg'."""
    return _paragraphs(examples / "morehopqa" / "morehopqa_final.example.json", {"Jaws (film)", "Steven Spielberg"})


@pytest.fixture
def nile():
    """A paragraph in MuSiQue's style (our own words) naming Tanzania, but neither Dodoma nor Djibouti."""
    return "Nile", (
        "The Nile is the longest river in Africa. Its most distant headwaters are often traced to the Kagera River, "
        "which drops over the Rusumo Falls near the Rwanda-Tanzania border before it flows into Lake Victoria."
    )


def _reason(checks, triple, title, text):
    verdict = checks.check(triple, DocumentTokens(title, text))
    return verdict.reason if verdict else None


def test_tokens_fold_case_accents_width_and_punctuation():
    assert tokens("Opéra  de PARIS, (1875).") == ["opera", "de", "paris", "1875"]
    assert tokens("Ｔｏｋｙｏ") == ["tokyo"]  # NFKC: full-width letters
    assert tokens("-89.2 °C") == ["89", "2", "c"]
    assert content_tokens("The Glass Orchard") == ["glass", "orchard"]


def test_grounded_rule():
    assert grounded(2, 2, "strict") and not grounded(1, 2, "strict")
    assert grounded(1, 2, "loose") and not grounded(1, 3, "loose") and not grounded(0, 1, "loose")
    assert not grounded(0, 0, "strict") and grounded(0, 0, "off")


def test_the_issue_s_bad_triples_are_dropped(film_docs, nile):
    checks = TripleChecks(EXAMPLE_TRIPLES, "strict")
    jaws, spielberg = film_docs["Jaws (film)"], film_docs["Steven Spielberg"]
    assert _reason(checks, ("Jaws", "lives in", "Aberystwyth"), "Jaws (film)", jaws) == "prompt_example"
    assert _reason(checks, ("Jaws", "follows", "a clockmaker"), "Jaws (film)", jaws) == "prompt_example"
    assert _reason(checks, ("Steven Spielberg", "associated with", "Steven Spielberg"), "Steven Spielberg", spielberg) == "self_loop"
    assert _reason(checks, ("steven spielberg.", "is", "Steven  Spielberg"), "Steven Spielberg", spielberg) == "self_loop"
    assert _reason(checks, ("Dodoma", "is the national capital of", "Djibouti"), *nile) == "ungrounded"
    assert checks.check(("Dodoma", "is the national capital of", "Djibouti"), DocumentTokens(*nile)).detail == "head 'Dodoma': not in the document: dodoma"
    # Loose still wants at least one token of each side.
    assert _reason(TripleChecks(EXAMPLE_TRIPLES, "loose"), ("Dodoma", "is the national capital of", "Djibouti"), *nile) == "ungrounded"
    # Off keeps it, but never a self-loop or an example's entity the document does not hold.
    off = TripleChecks(EXAMPLE_TRIPLES, "off")
    assert _reason(off, ("Dodoma", "is the national capital of", "Djibouti"), *nile) is None
    assert _reason(off, ("Jaws", "lives in", "Aberystwyth"), "Jaws (film)", jaws) == "prompt_example"


def test_triples_copied_from_the_document_pass(film_docs, nile):
    checks = TripleChecks(EXAMPLE_TRIPLES, "strict")
    jaws, spielberg = film_docs["Jaws (film)"], film_docs["Steven Spielberg"]
    good = [
        ("Jaws", "is a", "1975 American thriller film"),
        ("Jaws", "was directed by", "Steven Spielberg"),
        ("Jaws", "is based on", "the 1974 novel by Peter Benchley"),
        ("Jaws", "associated with", "America"),  # America/American: a trailing-characters match
        ("Jaws (film)", "is a", "thriller"),
    ]
    assert [_reason(checks, t, "Jaws (film)", jaws) for t in good] == [None] * len(good)
    assert _reason(checks, ("Steven Spielberg", "was born on", "18 December 1946"), "Steven Spielberg", spielberg) is None
    assert _reason(checks, ("Steven Spielberg", "was born in", "Cincinnati, Ohio"), "Steven Spielberg", spielberg) is None
    assert _reason(checks, ("Kagera River", "flows into", "Lake Victoria"), *nile) is None
    assert _reason(checks, ("Rusumo Falls", "located near", "Rwanda-Tanzania border"), *nile) is None
    # Not in the text, though true: strict drops it, loose keeps a side with half its words.
    assert _reason(checks, ("Jaws", "is a", "shark film"), "Jaws (film)", jaws) == "ungrounded"
    assert _reason(TripleChecks(EXAMPLE_TRIPLES, "loose"), ("Jaws", "is a", "shark film"), "Jaws (film)", jaws) is None
    # A pronoun names nothing.
    assert _reason(checks, ("Jaws", "is directed by", "him"), "Jaws (film)", jaws) == "ungrounded"


def test_an_example_entity_the_document_holds_is_kept(nile):
    checks = TripleChecks([("Vostok Station", "located in", "Antarctica"), ("Lake Victoria", "part of", "Africa")], "strict")
    # "Lake Victoria" is an example's entity too, but this document names it.
    assert _reason(checks, ("Kagera River", "flows into", "Lake Victoria"), *nile) is None
    assert _reason(checks, ("Kagera River", "located in", "Antarctica"), *nile) == "prompt_example"


def test_the_packaged_examples_pass_their_own_text():
    """The prompt asks for what the examples show; the strict rule must not reject its own examples."""
    checks = TripleChecks([], "strict")
    for ex in load_prompt().examples:
        doc = DocumentTokens(ex.title, ex.text)
        assert [t for t in ex.triples if checks.check(t, doc)] == []


def test_drop_shares():
    shares = drop_shares(Counters(out=6, rejected={"self_loop": 1, "ungrounded": 3, "no_triples": 5}))
    assert shares["self_loop"] == {"dropped": 1, "share": 0.1}
    assert shares["ungrounded"]["share"] == 0.3 and shares["prompt_example"]["dropped"] == 0
    assert drop_shares(Counters())["ungrounded"]["share"] == 0.0
