"""The retrieval prompt: the user turn for one question, the same in `export sft`, `export kto` and `retrieve`, so a
model is asked at retrieval time exactly what it was trained on."""

from __future__ import annotations

from grtool.docid import MARKERS

INSTRUCTION_TEMPLATE = (
    "Work out which documents answer the question below. Reason in short steps. Whenever a step needs a fact, "
    "retrieve it as a knowledge triple written {start}head, relation, tail{end}, and bring a new entity into "
    "your reasoning only through a triple you retrieved. If the retrieved triples are not enough, say that "
    "the question cannot be answered.\n\nQuestion: {question}"
)


# With --cannot-answer the instruction names the sentence to end with instead (export sft|kto and retrieve alike).
_CANNOT_DEFAULT = "say that the question cannot be answered."


def instruction(question: str, markers: str = "special", cannot_answer: str | None = None) -> str:
    """The user turn for one question (shared by SFT, KTO and retrieve so all see the same prompt)."""
    start, end = MARKERS[markers].start, MARKERS[markers].end
    template = INSTRUCTION_TEMPLATE
    if cannot_answer:
        template = template.replace(_CANNOT_DEFAULT, f'finish with "{cannot_answer.replace("{", "{{").replace("}", "}}")}"')
    return template.format(start=start, end=end, question=question.strip())
