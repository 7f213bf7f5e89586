"""The chain prompt: instructions, worked examples as earlier chat turns, then the question with its triples.

The triples a question is offered are its gold documents' triples plus ``distractors`` triples from other
documents, numbered after a shuffle seeded by (seed, qid): the same run always offers the same list, and the
gold triples do not sit in a telltale block at the top.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from grtool.chains.docids import Triple
from grtool.docid import BRACKETS, render
from grtool.errors import InputError
from grtool.llm.base import Messages
from grtool.vocab.text import CANNOT_ANSWER_SENTENCE

PROMPTS = Path(__file__).parent / "prompts"
DEFAULT_SYSTEM = PROMPTS / "system.txt"
DEFAULT_FEW_SHOT = PROMPTS / "few_shot.jsonl"


@dataclass(frozen=True)
class FewShot:
    question: str
    triples: tuple[tuple[str, str, str], ...]
    chain: str


@dataclass(frozen=True)
class ChainPrompt:
    """Instructions and examples, loaded once; :meth:`messages` builds one question's chat."""

    system: str
    examples: tuple[FewShot, ...]
    shown: int | None = None  # examples per prompt (None: all); corpus examples hold one spare
    cannot_answer: str | None = None  # --cannot-answer: the sentence written in place of CANNOT_ANSWER_SENTENCE

    def with_corpus_examples(self, corpus: str | Path, triples: str | Path, k: int, splits: tuple[str, ...] = ()) -> "ChainPrompt":
        """This prompt with K worked examples from the corpus's own questions and gold triples instead of its own;
        only of ``splits`` when given (a stage on train questions shows no other split's gold)."""
        from grtool.chains.corpus_examples import example_answer, pick_examples

        picked = pick_examples(corpus, triples, k, split=splits or None)
        examples = tuple(FewShot(e.question, e.triples, example_answer(e, "brackets")) for e in picked)
        return ChainPrompt(self.system, examples, k, self.cannot_answer)

    def with_cannot_answer(self, sentence: str | None) -> "ChainPrompt":
        """This prompt asking for ``sentence`` where it asks for :data:`CANNOT_ANSWER_SENTENCE` (the system rule
        and the worked examples), so the chains end the way `filters apply --cannot-answer` accepts."""
        if not sentence:
            return self
        if CANNOT_ANSWER_SENTENCE not in self.system:
            from grtool.log import log

            log.warning("--cannot-answer: the system prompt does not contain %r; only the examples are changed", CANNOT_ANSWER_SENTENCE)
        examples = tuple(FewShot(e.question, e.triples, e.chain.replace(CANNOT_ANSWER_SENTENCE, sentence)) for e in self.examples)
        return ChainPrompt(self.system.replace(CANNOT_ANSWER_SENTENCE, sentence), examples, self.shown, sentence)

    @classmethod
    def load(cls, prompt_file: Path | None = None, few_shot_file: Path | None = None) -> "ChainPrompt":
        system_path = prompt_file or DEFAULT_SYSTEM
        try:
            system = system_path.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise InputError(f"{system_path}: cannot read the prompt ({e.strerror})") from None
        if not system:
            raise InputError(f"{system_path}: the prompt file is empty")
        return cls(system, tuple(load_few_shot(few_shot_file or DEFAULT_FEW_SHOT)))

    def sha256(self) -> str:
        """Recorded in the manifest: a changed prompt or example set is a different run."""
        fields = {"system": self.system, "examples": [[e.question, e.triples, e.chain] for e in self.examples]}
        if self.shown is not None:  # only then: the digest of a prompt without it stays what earlier runs recorded
            fields["shown"] = self.shown
        payload = orjson.dumps(fields)
        return hashlib.sha256(payload).hexdigest()

    def messages(self, question: str, triples: Sequence[tuple[str, str, str]]) -> Messages:
        msgs: Messages = [{"role": "system", "content": self.system}]
        # Examples drawn from the corpus may include the very question: never show its own answer.
        shown = [ex for ex in self.examples if ex.question.strip() != question.strip()][: self.shown]
        for ex in shown:
            msgs.append({"role": "user", "content": user_turn(ex.question, ex.triples)})
            msgs.append({"role": "assistant", "content": ex.chain})
        msgs.append({"role": "user", "content": user_turn(question, triples)})
        return msgs


def user_turn(question: str, triples: Sequence[tuple[str, str, str]]) -> str:
    lines = [f"Question: {question.strip()}", "", "Triples:"]
    # rendered by the docid's home, as grtool.index.constraints.offered_docids reads it back
    lines += [f"{i}. {render((h, r, t), BRACKETS)}" for i, (h, r, t) in enumerate(triples, 1)]
    lines += ["", "Write the reasoning chain."]
    return "\n".join(lines)


def load_few_shot(path: Path) -> list[FewShot]:
    """JSON Lines of {"question", "triples": [[head, relation, tail], ...], "chain"}; an empty file means zero-shot."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read the few-shot file ({e.strerror})") from None
    examples = []
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}, line {lineno}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise InputError(f"{where}: not JSON ({e})") from None
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) and obj[k].strip() for k in ("question", "chain")):
            raise InputError(f"{where}: expected an object with non-empty strings 'question' and 'chain'")
        triples = obj.get("triples")
        if not isinstance(triples, list) or not triples or not all(isinstance(t, list) and len(t) == 3 and all(isinstance(x, str) and x.strip() for x in t) for t in triples):
            raise InputError(f"{where}: 'triples' must be a non-empty list of [head, relation, tail] strings")
        examples.append(FewShot(obj["question"], tuple(tuple(t) for t in triples), obj["chain"]))
    return examples


def offer_triples(qid: str, gold: Sequence[Triple], pool: Sequence[Triple], distractors: int, seed: int) -> list[Triple]:
    """Gold triples plus up to ``distractors`` pool triples from other documents, in a seeded shuffle.

    Pool triples from the question's gold documents, or spelled like a gold triple, are never distractors.
    """
    rng = random.Random(f"{seed}:{qid}")
    offered = list(gold)
    if distractors > 0 and pool:
        gold_docs = {t.doc_id for t in gold}
        seen = {t.text().casefold() for t in gold}
        # Rejection sampling over random positions: the pool is large and mostly non-gold, so this
        # needs about `distractors` draws; the cap only matters for a pool made of gold documents.
        for _ in range(distractors * 20):
            t = pool[rng.randrange(len(pool))]
            key = t.text().casefold()
            if t.doc_id in gold_docs or key in seen:
                continue
            seen.add(key)
            offered.append(t)
            if len(offered) - len(gold) == distractors:
                break
    rng.shuffle(offered)
    return offered
