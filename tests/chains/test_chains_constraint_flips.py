"""`chains synthesize --constrain`: the tail-first spellings a prompt's constraint allows are rendered from the
offered triples' stored parts, never split from the listed text (a head may hold a comma: ``Paris, Texas``)."""

from __future__ import annotations

import re

import numpy as np

from grtool.chains.prompt import user_turn
from grtool.docid import BRACKETS, flip, render
from grtool.index.constraints import constraint_from_spec, offered_regex, offered_triples
from grtool.index.decoding import Forbidden
from grtool.index.tokenizer import load_tokenizer
from grtool.llm.base import Sampling

COMMA_HEAD = ("Paris, Texas", "located in", "United States")
PLAIN = ("Walkman", "manufacturer", "Sony")
OTHER = ("Rusalka", "composer of", "Antonín Dvořák")  # in the pool of the batch, not offered by this prompt
PROMPT = f"{user_turn('Where is Paris, Texas?', [COMMA_HEAD, PLAIN])}"
FORWARD = "Paris, Texas, located in, United States"
FLIPPED = "United States, located in, Paris, Texas"
SPLIT_FLIP = "located in, United States, Texas, Paris"  # what cutting the text at its first two commas flips to
SPEC = {"markers": "brackets", "source": "prompt", "triples": [list(COMMA_HEAD), list(PLAIN), list(OTHER)]}


def _accepts(constraint, prompt_ids: list[int], ids: list[int]) -> bool:
    state = constraint.initial(prompt_ids)
    for token in ids:
        allowed = constraint.allowed(state)
        if isinstance(allowed, Forbidden):
            if token in set(allowed.ids.tolist()):
                return False
        elif allowed is not None and token not in set(np.asarray(allowed).tolist()):
            return False
        state = constraint.advance(state, token)
    return constraint.is_free(state)


def test_the_constraint_offers_exactly_both_spellings_of_a_comma_head():
    tok = load_tokenizer("default").tokenizer
    constraint = constraint_from_spec(SPEC, tok)
    prompt_ids = tok.encode(PROMPT, add_special_tokens=False).ids
    offered = set(constraint.initial(prompt_ids)[0].docs)
    expected = {FORWARD, FLIPPED, "Walkman, manufacturer, Sony", "Sony, manufacturer, Walkman"}
    assert offered == {d.encode() for d in expected}
    assert BRACKETS.unwrap(render(flip(COMMA_HEAD), BRACKETS)) == FLIPPED
    for text, ok in ((FORWARD, True), (FLIPPED, True), (SPLIT_FLIP, False), ("Antonín Dvořák, composer of, Rusalka", False)):
        ids = tok.encode(f" [{text}] then", add_special_tokens=False).ids
        assert _accepts(constraint, prompt_ids, ids) is ok, text


def test_the_openai_regex_offers_exactly_both_spellings_of_a_comma_head():
    pattern = re.compile(offered_regex(PROMPT, SPEC["triples"]))
    assert pattern.fullmatch(f"so [{FORWARD}] and [{FLIPPED}].")
    assert not pattern.fullmatch(f"so [{SPLIT_FLIP}].")
    assert not pattern.fullmatch("so [Antonín Dvořák, composer of, Rusalka].")


def test_a_request_travels_with_its_own_triples_outside_its_cache_key():
    assert offered_triples(PROMPT, SPEC["triples"]) == [COMMA_HEAD, PLAIN]
    with_parts = Sampling(constraint=SPEC).as_dict()
    assert with_parts == Sampling(constraint={"markers": "brackets", "source": "prompt"}).as_dict()
