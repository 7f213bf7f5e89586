"""Chain synthesis pieces that need no model: docid normalization, prompts, offered triples, entropy scoring."""

from __future__ import annotations

import math

import pytest

from grtool.chains.docids import Markers, OfferedTriples, Triple, looks_like_triple, normalize_chain
from grtool.chains.entropy import EntropyScorer, aligned_tokens, pick_lowest, score_doc, token_entropy, uncertainties
from grtool.chains.prompt import ChainPrompt, load_few_shot, offer_triples, user_turn
from grtool.errors import InputError
from grtool.llm.base import TokenLogprobs

# Real 2WikiMultihopQA evidence triples (dev set), including entities with commas in them.
MOZA = [
    Triple("d-mohammed", 0, "Mohammed bin Hamad bin Khalifa Al Thani", "mother", "Moza bint Nasser"),
    Triple("d-moza", 0, "Moza bint Nasser", "place of birth", "Al Khor"),
]
ANA = [
    Triple("d-ana", 0, "Ana, mon amour", "director", "Călin Peter Netzer"),
    Triple("d-netzer", 0, "Călin Peter Netzer", "place of birth", "Petroșani"),
]
STAFFORD = [
    Triple("d-stafford", 0, "Humphrey Stafford", "father", "Humphrey Stafford, 1st Duke of Buckingham"),
    Triple("d-duke", 0, "Humphrey Stafford, 1st Duke of Buckingham", "place of death", "Northampton"),
]
S, E = "<docid_start>", "<docid_end>"


def test_brackets_become_docids_in_order():
    chain = (
        "Mohammed's mother is found with [Mohammed bin Hamad bin Khalifa Al Thani, mother, Moza bint Nasser]. "
        "She was born according to [Moza bint Nasser, place of birth, Al Khor]. So the answer is Al Khor."
    )
    got = normalize_chain(chain, OfferedTriples.of(MOZA))
    assert got.docids == [
        f"{S}Mohammed bin Hamad bin Khalifa Al Thani, mother, Moza bint Nasser{E}",
        f"{S}Moza bint Nasser, place of birth, Al Khor{E}",
    ]
    assert got.flipped == [False, False]
    assert got.sources == MOZA
    assert got.text == (f"Mohammed's mother is found with {got.docids[0]}. She was born according to {got.docids[1]}. So the answer is Al Khor.")
    assert "[" not in got.text


def test_flipped_triple_is_recognized_and_kept_in_the_written_direction():
    chain = "The film Petroșani is the birthplace of the director: [Petroșani, place of birth, Călin Peter Netzer], and [Călin Peter Netzer, director, Ana, mon amour]."
    got = normalize_chain(chain, OfferedTriples.of(ANA))
    assert got.flipped == [True, True]
    assert got.sources == [ANA[1], ANA[0]]
    assert got.docids == [f"{S}Petroșani, place of birth, Călin Peter Netzer{E}", f"{S}Călin Peter Netzer, director, Ana, mon amour{E}"]


def test_commas_inside_entities_match_the_offered_triple():
    chain = "[Humphrey Stafford, father, Humphrey Stafford, 1st Duke of Buckingham] then [Humphrey Stafford, 1st Duke of Buckingham, place of death, Northampton]."
    got = normalize_chain(chain, OfferedTriples.of(STAFFORD))
    assert got.sources == STAFFORD and got.flipped == [False, False]
    assert got.unmatched == 0


def test_case_and_spacing_are_forgiven_and_the_stored_spelling_is_written():
    chain = "It follows from [  moza bint nasser ,place of birth ,  al khor ]."
    got = normalize_chain(chain, OfferedTriples.of(MOZA))
    assert got.docids == [f"{S}Moza bint Nasser, place of birth, Al Khor{E}"]
    assert got.sources == [MOZA[1]]


def test_brackets_that_are_not_triples_are_left_alone():
    chain = "See [1] and [citation needed]; the pair [Ana, Netzer] and the numbers [1, 2, 3] are not docids. [Ana, mon amour, director, Călin Peter Netzer]"
    got = normalize_chain(chain, OfferedTriples.of(ANA))
    assert got.text.startswith("See [1] and [citation needed]; the pair [Ana, Netzer] and the numbers [1, 2, 3] are not docids. ")
    assert got.docids == [f"{S}Ana, mon amour, director, Călin Peter Netzer{E}"]


def test_a_triple_that_was_not_offered_is_marked_but_has_no_source():
    chain = "He was born in [Călin Peter Netzer, place of birth, Bucharest]."
    got = normalize_chain(chain, OfferedTriples.of(ANA))
    assert got.docids == [f"{S}Călin Peter Netzer, place of birth, Bucharest{E}"]
    assert got.sources == [None] and got.unmatched == 1 and got.flipped == [False]


def test_chains_already_in_markers_are_parsed_and_custom_markers_used():
    markers = Markers("<|d|>", "<|/d|>")
    chain = "First <|d|>Moza bint Nasser, mother, Mohammed bin Hamad bin Khalifa Al Thani<|/d|>, then [Moza bint Nasser, place of birth, Al Khor]."
    got = normalize_chain(chain, OfferedTriples.of(MOZA), markers)
    assert got.flipped == [True, False]
    assert got.text == ("First <|d|>Moza bint Nasser, mother, Mohammed bin Hamad bin Khalifa Al Thani<|/d|>, then <|d|>Moza bint Nasser, place of birth, Al Khor<|/d|>.")


def test_looks_like_triple():
    assert looks_like_triple("Niyoti, publication date, 2016")
    assert not looks_like_triple("Niyoti, 2016")
    assert not looks_like_triple("1, 2, 3")
    assert not looks_like_triple("a, , b")


# ------------------------------------------------------------------------------------------ prompt


def test_default_prompt_has_rules_and_worked_examples():
    prompt = ChainPrompt.load()
    assert "square brackets" in prompt.system and "not enough to answer" in prompt.system
    assert len(prompt.examples) >= 3
    msgs = prompt.messages("Where was the mother of Mohammed born?", [(t.head, t.relation, t.tail) for t in MOZA])
    assert msgs[0]["role"] == "system"
    assert [m["role"] for m in msgs[1:]] == ["user", "assistant"] * len(prompt.examples) + ["user"]
    last = msgs[-1]["content"]
    assert "1. [Mohammed bin Hamad bin Khalifa Al Thani, mother, Moza bint Nasser]" in last
    assert "2. [Moza bint Nasser, place of birth, Al Khor]" in last
    # Every worked example cites only triples it offers, so it teaches the format it asks for.
    for ex in prompt.examples:
        offered = OfferedTriples.of(Triple("x", i, *t) for i, t in enumerate(ex.triples))
        got = normalize_chain(ex.chain, offered)
        assert got.docids and got.unmatched == 0
    assert any(any(normalize_chain(ex.chain, OfferedTriples.of(Triple("x", i, *t) for i, t in enumerate(ex.triples))).flipped) for ex in prompt.examples)
    assert any("not enough to answer" in ex.chain for ex in prompt.examples)


def test_prompt_files_override_and_bad_few_shot_names_the_line(tmp_path):
    (tmp_path / "p.txt").write_text("Answer with triples.\n")
    (tmp_path / "fs.jsonl").write_text('{"question": "Q?", "triples": [["a", "b", "c"]], "chain": "[a, b, c]. So the answer is c."}\n')
    prompt = ChainPrompt.load(tmp_path / "p.txt", tmp_path / "fs.jsonl")
    assert prompt.system == "Answer with triples." and len(prompt.examples) == 1
    assert prompt.sha256() != ChainPrompt.load().sha256()
    (tmp_path / "bad.jsonl").write_text('{"question": "Q?", "triples": [["a", "b"]], "chain": "x"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl, line 1: 'triples'"):
        load_few_shot(tmp_path / "bad.jsonl")
    with pytest.raises(InputError, match="cannot read the prompt"):
        ChainPrompt.load(tmp_path / "missing.txt")


def test_offered_triples_are_seeded_shuffles_with_distractors_from_other_documents():
    pool = ANA + STAFFORD + [Triple("d-moza", 5, "Moza bint Nasser", "spouse", "Hamad bin Khalifa Al Thani")]
    a = offer_triples("q1", MOZA, pool, distractors=3, seed=0)
    assert a == offer_triples("q1", MOZA, pool, distractors=3, seed=0)
    assert set(MOZA) <= set(a) and len(a) == 5
    assert all(t.doc_id not in {"d-mohammed", "d-moza"} for t in a if t not in MOZA)
    orders = {tuple(offer_triples("q1", MOZA, pool, distractors=3, seed=s)) for s in range(12)}
    assert len(orders) > 1
    assert offer_triples("q1", MOZA, [], distractors=3, seed=0) != [] and len(offer_triples("q1", MOZA, [], 3, 0)) == 2


def test_user_turn_numbers_triples():
    text = user_turn(" Q? ", [("a", "b", "c"), ("d", "e", "f")])
    assert text.splitlines()[:5] == ["Question: Q?", "", "Triples:", "1. [a, b, c]", "2. [d, e, f]"]


# ----------------------------------------------------------------------------------------- entropy


def tok(text: str, *alts: float) -> TokenLogprobs:
    """A token whose own logprob is alts[0]; the other alternatives get made-up token strings."""
    top = {text: alts[0]}
    top.update({f"<alt{i}>": lp for i, lp in enumerate(alts[1:])})
    return TokenLogprobs(text, alts[0], top)


def test_token_entropy_values():
    assert token_entropy(tok("a", math.log(0.25), math.log(0.25), math.log(0.25), math.log(0.25))) == pytest.approx(math.log(4))
    assert token_entropy(tok("a", 0.0)) == 0.0
    # Renormalized over the top-k: two alternatives at equal probability are one bit whatever their mass.
    assert token_entropy(tok("a", math.log(0.1), math.log(0.1))) == pytest.approx(math.log(2))
    # The chosen token outside the top list still counts.
    assert token_entropy(TokenLogprobs("a", math.log(0.5), {"b": math.log(0.5)})) == pytest.approx(math.log(2))
    assert token_entropy(TokenLogprobs("a", -0.1, {"a": -0.1, "b": -math.inf})) == 0.0


SURE = (math.log(0.97), math.log(0.01), math.log(0.01), math.log(0.01))
UNSURE = (math.log(0.25),) * 4
HALF = (math.log(0.5), math.log(0.5))


def tokens(pieces: list[tuple[str, tuple[float, ...]]]) -> list[TokenLogprobs]:
    return [tok(text, *lps) for text, lps in pieces]


@pytest.fixture(scope="module")
def scorer():
    return EntropyScorer()


def test_word_uncertainty_is_the_max_over_its_tokens_and_entities_over_their_words(scorer):
    # "Khor" is two model tokens; only the second is unsure, so the word is unsure, and so is "Al Khor".
    lps = tokens([("He", SURE), (" was", SURE), (" born", HALF), (" in", HALF), (" Al", HALF), (" K", SURE), ("hor", UNSURE), (",", SURE), (" Qatar", SURE), (".", SURE)])
    text, starts, ends, ent = aligned_tokens(lps)
    assert text == "He was born in Al Khor, Qatar."
    # An end-of-turn token after the text covers no word.
    assert aligned_tokens(lps + [tok("<|im_end|>", *SURE)], text)[0] == text
    doc = scorer.nlp(text)
    assert [e.text for e in doc.ents] == ["Al Khor", "Qatar"]
    s, h, u = token_entropy(tok("x", *SURE)), math.log(2), math.log(4)
    # Units: He was born in [Al Khor] Qatar (no punctuation). "Al Khor" replaces its two words (max h, u = u);
    # the single-word entity "Qatar" is its word, counted once.
    assert uncertainties(doc, starts, ends, ent) == pytest.approx([s, s, h, h, u, s])
    # Median over the six units s s s h h u: the mean of the middle two, (s + h) / 2. (Counting words and
    # entities side by side, s s s s h h h u u, gave h.)
    assert score_doc(doc, starts, ends, ent) == pytest.approx((s + h) / 2)


def test_entropy_selection_picks_the_most_certain_candidate(scorer):
    words = ["The", " director", " was", " born", " in", " Petroșani", ",", " Romania", "."]

    def cand(levels):
        return [tok(text, *lvl) for text, lvl in zip(words, levels)]

    mild = (math.log(0.9), math.log(0.05), math.log(0.05))
    confident = cand([SURE] * 9)
    # 4 of its 7 units unsure (entities count once, as their words: 3 of 7 would leave the median sure)
    unsure_facts = cand([SURE, UNSURE, SURE, UNSURE, SURE, UNSURE, SURE, UNSURE, SURE])
    hesitant = cand([HALF] * 9)
    everywhere_mild = cand([mild] * 9)
    # One very unsure word in an otherwise sure chain: its median is low, though its mean is above the mild one's.
    one_outlier = cand([SURE] * 3 + [(math.log(0.05),) * 20] + [SURE] * 5)
    scores = scorer.score([(None, c) for c in (hesitant, unsure_facts, everywhere_mild, one_outlier, confident)])
    assert scores[4] == pytest.approx(token_entropy(tok("x", *SURE)))
    assert scores[0] == pytest.approx(math.log(2))
    assert scores[4] <= scores[3] < scores[2] < scores[0]
    assert scores[4] < scores[1]
    assert pick_lowest([scores[0], scores[1], scores[2], scores[4]]) == 3
    assert pick_lowest(scores[:4]) == 3
    assert pick_lowest(scores) == 3  # a tie goes to the earlier candidate
    assert pick_lowest([None, 0.5, 0.2, 0.2]) == 2
    assert pick_lowest([None, None]) == 0


def test_missing_logprobs_is_a_clear_error(scorer):
    from grtool.errors import GrtoolError

    with pytest.raises(GrtoolError, match="without logprobs.*--select first"):
        scorer.score([("text", None)])


def test_a_chain_without_words_scores_none(scorer):
    assert scorer.score([(".", [tok(".", *SURE)]), ("", [])]) == [None, None]


def test_default_candidates_are_greg_s_five_one_greedy_four_sampled():
    from typer.testing import CliRunner

    from grtool.chains.synthesize import ChainSettings
    from grtool.cli.main import app

    settings = ChainSettings()
    assert settings.candidates == 5
    assert [settings.sampling(c).temperature for c in range(5)] == [0.0, 0.7, 0.7, 0.7, 0.7]
    help_text = " ".join(CliRunner().invoke(app, ["chains", "synthesize", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "(GReG: 5)" in help_text and "[default: 5]" in help_text


def test_cannot_answer_sentence_replaces_grtools_in_the_chain_prompt():
    from grtool.vocab.text import CANNOT_ANSWER_SENTENCE
    from grtool.chains.prompt import ChainPrompt

    default = ChainPrompt.load()
    assert CANNOT_ANSWER_SENTENCE in default.system and default.with_cannot_answer(None) is default
    mine = default.with_cannot_answer("Nothing here answers it.")
    assert CANNOT_ANSWER_SENTENCE not in mine.system and '"Nothing here answers it."' in mine.system
    assert any(e.chain.endswith("Nothing here answers it.") for e in mine.examples)
    assert not any(CANNOT_ANSWER_SENTENCE in e.chain for e in mine.examples)
    assert mine.sha256() != default.sha256() and mine.cannot_answer == "Nothing here answers it."
