"""The chat prompt `grtool retrieve` sends: the SFT instruction, after optional few-shot turns.

The user turn is :func:`grtool.vocab.prompt.instruction`, the one `export sft` and `export kto` train on, so a
trained model sees at inference the prompt it learned. Off-the-shelf models (``--markers brackets``) get
``--few-shot K`` worked turns first: questions of ``--few-shot-from`` (the corpus's train split by default), each
answered by a short chain that retrieves one gold triple per gold document, in hop order. The examples are picked
by a stable hash of the qid (the same for every run and every shard) among the questions not being answered
(:func:`grtool.retrieve.run.retrieve_prompt`), so no evaluated question's gold docids appear in a prompt.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from grtool.chains.corpus_examples import Example, example_answer
from grtool.vocab.prompt import instruction
from grtool.llm.base import Messages


@dataclass
class RetrievePrompt:
    markers: str
    examples: list[Example]
    k: int
    system: str | None = None
    cannot_answer: str | None = None  # --cannot-answer: the sentence the instruction names (as export sft did)

    def messages(self, qid: str, question: str) -> Messages:
        turns: Messages = [{"role": "system", "content": self.system}] if self.system else []
        for ex in [e for e in self.examples if e.qid != qid][: self.k]:
            turns.append({"role": "user", "content": instruction(ex.question, self.markers, self.cannot_answer)})
            turns.append({"role": "assistant", "content": example_answer(ex, self.markers)})
        turns.append({"role": "user", "content": instruction(question, self.markers, self.cannot_answer)})
        return turns

    def sha256(self) -> str:
        text = "\n".join(f"{e.qid}\t{example_answer(e, self.markers)}" for e in self.examples[: self.k + 1])
        cannot = f"\n{self.cannot_answer}" if self.cannot_answer else ""  # only when given: earlier digests stay
        return hashlib.sha256(f"{self.markers}\n{self.system or ''}\n{self.k}\n{text}{cannot}".encode()).hexdigest()
