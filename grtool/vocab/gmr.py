"""The steps of generative multi-hop retrieval (GMR/GRLS style), shared by `export gmr` (the training pairs),
`train` (their chat) and `retrieve --mode gmr` (the same prompt at decoding time), and by `index build` (a
document's rendering, the string a ``--source documents`` index holds).

Step k's input is the question followed by the k gold documents already retrieved; its target is gold document
k+1, and the last step's target is ``DONE``. A document is written as ``title: text``, the same string as target
and as evidence.
"""

from __future__ import annotations

from typing import Any

GMR = "gmr"  # the data format of `export gmr` pairs, recorded as data.format in the checkpoint's grtool.json
DONE = "DONE"
MEMORIZATION_SHARE = 0.7


def render_document(title: str | None, text: str | None) -> str:
    title, text = (title or "").strip(), (text or "").strip()
    return f"{title}: {text}" if title else text


def step_input(question: str, evidence: list[str]) -> str:
    parts = [f"<QUESTION> {question.strip()} </QUESTION>"]
    parts += [f"<EVIDENCE> {doc} </EVIDENCE>" for doc in evidence]
    return " ".join(parts)


def step_request(step: str) -> list[dict[str, str]]:
    """The chat for one pair's input (a :func:`step_input`, or a memorization prefix): the input as the only user
    turn. `train sft` trains on it and `retrieve --mode gmr` decodes with it, so both see the same prompt."""
    return [{"role": "user", "content": step}]


def retrieval_pairs(qid: str, question: str, gold_docs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The n + 1 step pairs of one question; ``gold_docs`` = [(doc_id, rendered document)] in hop order."""
    pairs = []
    for step in range(len(gold_docs) + 1):
        evidence = [doc for _, doc in gold_docs[:step]]
        done = step == len(gold_docs)
        pairs.append(
            {
                "kind": "retrieval",
                "qid": qid,
                "step": step,
                "input": step_input(question, evidence),
                "target": DONE if done else gold_docs[step][1],
                "doc_id": None if done else gold_docs[step][0],
            }
        )
    return pairs


def memorization_pair(doc_id: str, document: str, share: float = MEMORIZATION_SHARE) -> dict[str, Any] | None:
    """First ``share`` of the words → the rest; None for a document of fewer than two words."""
    words = document.split()
    if len(words) < 2:
        return None
    cut = min(max(int(len(words) * share), 1), len(words) - 1)
    return {"kind": "memorization", "doc_id": doc_id, "input": " ".join(words[:cut]), "target": " ".join(words[cut:])}
