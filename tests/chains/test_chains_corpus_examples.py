"""Few-shot turns built from the corpus's own questions (`chains synthesize --few-shot-corpus`, `retrieve --few-shot`)."""

from __future__ import annotations

import pytest
from sample_helpers import build_samples

from grtool.chains.corpus_examples import example_answer, pick_examples
from grtool.chains.prompt import ChainPrompt
from grtool.docid import parse
from grtool.store.stage import read_table


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("examples") / "run"
    build_samples(root)
    return root


def test_examples_cite_one_gold_triple_per_gold_document(run):
    examples = pick_examples(run, run / "triples", 2)
    assert len(examples) == 3  # K + 1: a prompt can leave its own question out and still show K
    questions = {q["qid"]: q for q in read_table(run / "questions").to_pylist()}
    triples = {(t["head"], t["relation"], t["tail"]): t["doc_id"] for t in read_table(run / "triples").to_pylist()}
    for ex in examples:
        gold = questions[ex.qid]["gold_doc_ids"]
        assert [triples[t] for t in ex.triples] == list(gold)  # hop order
        text = example_answer(ex, "brackets")
        assert len(parse(text).docids) == len(gold) and text.endswith(f"So the answer is {ex.answer}.")
    assert pick_examples(run, run / "triples", 2) == examples  # the same every run


def test_chain_prompt_never_shows_the_question_its_own_example(run):
    prompt = ChainPrompt.load().with_corpus_examples(run, run / "triples", 2)
    asked = prompt.examples[0].question
    msgs = prompt.messages(asked, [("a", "b", "c")])
    shown = [m["content"] for m in msgs if m["role"] == "user"][:-1]
    assert len(shown) == 2 and not any(asked in turn for turn in shown)
    other = prompt.messages("A question of no example?", [("a", "b", "c")])
    assert len([m for m in other if m["role"] == "user"]) == 3  # K examples, then the question
    assert prompt.sha256() != ChainPrompt.load().sha256()


def test_retrieve_draws_worked_examples_only_outside_the_answered_questions(run):
    """`retrieve --few-shot`: the examples come from --few-shot-from (default: the corpus's train split) and never
    from a question being answered; none usable is a usage error naming the option."""
    from grtool.errors import InputError
    from grtool.retrieve.run import RetrieveRequest, few_shot_record, retrieve_prompt

    questions = read_table(run / "questions").to_pylist()
    splits = {q["split"] for q in questions}
    assert "train" not in splits  # the samples are dev questions: the default source has none
    request = RetrieveRequest(corpus=str(run), index=run / "index", out=run / "out", markers="brackets", few_shot=2)
    everything = {q["qid"] for q in questions}
    with pytest.raises(InputError, match="--few-shot-from train"):
        retrieve_prompt(request, run / "triples", everything)
    usable = [e.qid for e in pick_examples(run, run / "triples", 6)]
    asked = set(usable[:3])  # the questions of lowest hash, the ones an unfiltered pick shows first
    for source in (str(run), sorted(splits)[0]):  # a directory, a split of the corpus
        given = RetrieveRequest(corpus=str(run), index=run / "index", out=run / "out", markers="brackets", few_shot=2, few_shot_from=source)
        prompt = retrieve_prompt(given, run / "triples", asked)
        shown = [e.qid for e in prompt.examples]
        assert len(shown) == 2 and not set(shown) & asked
        assert few_shot_record(given, prompt)["qids"] == shown
        with pytest.raises(InputError, match=f"--few-shot-from {source}"):
            retrieve_prompt(given, run / "triples", everything)
