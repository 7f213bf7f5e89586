"""One record of a release file → a question row and the documents it carries.

Each dataset has a converter ``record -> Converted``; a record that does not fit (missing field, wrong type)
raises :class:`BadRecord`, which the caller rejects (or, under ``--strict``, turns into an error).

How each dataset's gold documents are read (``gold_doc_ids`` keeps hop order where the data has one):
- HotpotQA (original and Hugging Face layout): the context paragraphs whose titles appear in
  ``supporting_facts``, in supporting-fact order. In the fullwiki setting the gold paragraph may be absent
  from the retrieved context; such titles are listed in ``meta.gold_titles_missing``.
- 2WikiMultihopQA: the same, by ``supporting_facts`` titles (their order follows the evidence chain).
- MuSiQue: paragraphs with ``is_supporting`` (titles repeat within a question, so paragraphs are matched
  by ``idx``), ordered by ``question_decomposition[].paragraph_support_idx``. Unanswerable MuSiQue-full
  records have ``answerable = false`` and no gold; they share their id with their answerable twin, so
  their qid is ``<id>__unanswerable`` (``meta.musique_id`` keeps the original).
- MoreHopQA: every context paragraph is gold (its context holds only the supporting paragraphs), ordered by
  ``question_decomposition[].paragraph_support_title``.
- The generic layout (a researcher's own data, see docs/data-formats.md): questions name their gold documents
  by the ids or titles of a separate documents file, in hop order; those references are resolved once every
  input has been read (:mod:`grtool.corpus.generic`).

Paragraph text is the dataset's own: HotpotQA sentences are concatenated as given (each later sentence
carries its leading space); 2Wiki sentences carry no leading space and are joined with one space; MuSiQue
has one string per paragraph. MoreHopQA copies paragraphs from those datasets, so it joins them the way its
source dataset does (the source is read from the question id); a paragraph given as one string is kept.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from grtool.corpus.doc_hash import doc_id
from grtool.store.questions import SPLIT_RULE, canonical_split

# meta key of the gold titles a question's context lacks (HotpotQA fullwiki); present only when non-empty
GOLD_TITLES_MISSING = "gold_titles_missing"


def gold_incomplete_expr():
    """Polars expression over ``meta`` (JSON text): the question's gold documents are incomplete."""
    import polars as pl  # only the table-level readers need polars, not the record converters

    return pl.col("meta").str.contains(f'"{GOLD_TITLES_MISSING}"', literal=True)


def gold_incomplete(meta: str | None) -> bool:
    """The same test on one row's ``meta``."""
    return f'"{GOLD_TITLES_MISSING}"' in (meta or "")


HOTPOTQA = "hotpotqa"
TWOWIKI = "2wikimultihopqa"
MUSIQUE = "musique"
MOREHOPQA = "morehopqa"
HOTPOTQA_WIKI = "hotpotqa-wiki"
GENERIC = "generic"
GENERIC_DOCUMENTS = "generic-documents"  # a converter, not a dataset: the documents file of the generic layout
INLINE = "inline"  # your own questions with their paragraphs inline (the Hugging Face / FlashRAG shape)
DATASETS = (HOTPOTQA, TWOWIKI, MUSIQUE, MOREHOPQA, HOTPOTQA_WIKI, GENERIC, INLINE)
FORMATS_DOC = "docs/data-formats.md"  # where every input layout is described (named in error messages)

# The corpus a dataset's documents belong to: the Wikipedia abstracts dump *is* HotpotQA's corpus.
# Both layouts of your own data are tagged generic.
CORPUS_LABEL = {HOTPOTQA_WIKI: HOTPOTQA, GENERIC_DOCUMENTS: GENERIC, INLINE: GENERIC}

# Sentence joins (see module docstring).
JOIN = {HOTPOTQA: "", TWOWIKI: " ", MUSIQUE: " ", MOREHOPQA: " "}


class BadRecord(Exception):
    """A record that does not fit its dataset's schema; ``reason`` is short and countable."""

    def __init__(self, reason: str, detail: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


@dataclass
class Converted:
    question: dict[str, Any] | None  # None for corpus-only records (Wikipedia dump)
    documents: list[tuple[str, str, str]] = field(default_factory=list)  # (doc_id, title, text)
    # generic layout: the question's gold documents as given, ("id" | "title", [...]) in hop order, resolved
    # after every input is read; and a document's own id (its key in the questions' gold_doc_ids)
    gold_refs: tuple[str, list[str]] | None = None
    source_id: str | None = None


# ------------------------------------------------------------------------------------------ helpers


def _field(rec: dict, key: str, kind: type | tuple[type, ...], *, optional: bool = False, default: Any = None) -> Any:
    if key not in rec or rec[key] is None:
        if optional:
            return default
        raise BadRecord(f"missing field '{key}'")
    value = rec[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRecord(f"field '{key}' has the wrong type", f"expected {names}, got {type(value).__name__}")
    return value


def record_id(rec: dict, *keys: str) -> str:
    """The record's id under the first of ``keys`` present. Scalar ids become strings: vendored copies of the
    datasets carry integer ``_id``s (an integral float reads as an integer)."""
    for key in keys:
        value = rec.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            text = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRecord(f"field '{key}' has the wrong type", f"expected a string or number id, got {type(value).__name__}")
        elif isinstance(value, float) and value != value:  # NaN: a table export's missing value, never the id "nan"
            raise BadRecord(f"field '{key}' is blank", "NaN (a missing value in a table export) names no record: give an id")
        elif isinstance(value, float) and abs(value) >= 2**53:  # a float past 2**53 has lost digits: two ids may collide
            raise BadRecord(f"field '{key}' has the wrong type", f"the number {value!r} is too large to be an exact id; write ids as strings")
        else:
            text = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if not text.strip():
            raise BadRecord(f"field '{key}' is blank", "an id names its record: give it a non-blank value")
        return text
    raise BadRecord(f"missing field '{keys[0]}'")


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise BadRecord(f"field '{what}' has the wrong type", "expected a list of strings")
    return value


def _meta(rec: dict, used: set[str], **derived: Any) -> str:
    """Every field not mapped to a column or to documents, plus derived facts, as JSON text (values Parquet or Arrow
    inputs hold that JSON has no type for, such as bytes, as text)."""
    meta = {k: v for k, v in rec.items() if k not in used}
    meta.update({k: v for k, v in derived.items() if v is not None})
    return orjson.dumps(meta, default=str).decode()


def _unique(ids: list[str]) -> list[str]:
    return list(dict.fromkeys(ids))


def _question(qid: str, dataset: str, split: str, rec: dict, *, answer: Any, aliases: list[str], gold: list[str], type_: Any, answerable: bool, meta: str) -> dict[str, Any]:
    if answer is not None and not isinstance(answer, str):
        raise BadRecord("field 'answer' has the wrong type", f"expected str, got {type(answer).__name__}")
    if type_ is not None and not isinstance(type_, str):
        raise BadRecord("field 'type' has the wrong type", f"expected str, got {type(type_).__name__}")
    question = _field(rec, "question", str)
    if not question.strip():
        raise BadRecord("empty question", "the question is empty or blank")
    if answerable and dataset == GENERIC and not (answer or "").strip():
        raise BadRecord("empty answer", "an answerable question needs a non-blank answer")
    return {
        "qid": qid,
        "dataset": dataset,
        "split": split,
        "question": question,
        "answer": answer,
        "answer_aliases": aliases,
        "gold_doc_ids": gold,
        "type": type_,
        "answerable": answerable,
        "meta": meta,
    }


def _titled_paragraphs(context: Any, join: str) -> list[tuple[str, str, str]]:
    """``[[title, sentences], ...]`` → ``(doc_id, title, text)`` in context order."""
    if not isinstance(context, list):
        raise BadRecord("field 'context' has the wrong type", "expected a list of [title, sentences]")
    docs = []
    for i, item in enumerate(context):
        if not (isinstance(item, list | tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise BadRecord("field 'context' has the wrong type", f"context[{i}] is not [title, sentences]")
        title, body = item
        if isinstance(body, str):
            text = body
        elif isinstance(body, list):
            try:  # join checks the element types itself, cheaper than checking them first
                text = join.join(body)
            except TypeError:
                raise BadRecord("field 'context' has the wrong type", f"context[{i}] sentences must be strings") from None
        else:
            raise BadRecord("field 'context' has the wrong type", f"context[{i}] is not [title, sentences]")
        docs.append((doc_id(title, text), title, text))
    return docs


def _gold_by_titles(docs: list[tuple[str, str, str]], supporting_facts: Any) -> tuple[list[str], list[str], list[str]]:
    """Gold doc ids by supporting-fact titles, in supporting-fact order; also the titles and missing ones."""
    if not isinstance(supporting_facts, list) or not all(isinstance(sf, list | tuple) and len(sf) >= 1 and isinstance(sf[0], str) for sf in supporting_facts):
        raise BadRecord("field 'supporting_facts' has the wrong type", "expected a list of [title, sentence index]")
    titles = _unique([sf[0] for sf in supporting_facts])
    by_title: dict[str, list[str]] = {}
    for did, title, _ in docs:
        by_title.setdefault(title, []).append(did)
    gold = _unique([did for t in titles for did in by_title.get(t, [])])
    missing = [t for t in titles if t not in by_title]
    return gold, titles, missing


# ------------------------------------------------------------------------------------------ HotpotQA


def _rows(columns: Any, keys: tuple[str, ...], what: str) -> list[list]:
    """A Hugging Face ``datasets`` sequence of structs, stored as a dict of parallel lists, back as rows
    ``[[keys[0] value, keys[1] value, ...], ...]``."""
    lists = [columns.get(k) if isinstance(columns, dict) else None for k in keys]
    if not all(isinstance(col, list) for col in lists) or len({len(col) for col in lists}) > 1:
        shape = "{" + ", ".join(f"{k}: [...]" for k in keys) + "}"
        raise BadRecord(f"field '{what}' has the wrong type", f"expected {shape} of equal length")
    return [list(row) for row in zip(*lists)]


def _parallel_layout(rec: dict, sentences_key: str) -> tuple[str, list, list | None]:
    """Context and supporting facts in the original layout, whichever layout the record uses: the Hugging Face
    layouts store ``context`` as ``{title: [...], <sentences_key>: [[...]]}`` and ``supporting_facts`` as
    ``{title: [...], sent_id: [...]}``."""
    context = rec.get("context")
    sf = rec.get("supporting_facts")
    if isinstance(context, dict):
        context = _rows(context, ("title", sentences_key), "context")
        if isinstance(sf, dict):
            sf = _rows(sf, ("title", "sent_id"), "supporting_facts")
        return "hf", context, sf
    if context is None:
        raise BadRecord("missing field 'context'")
    return "original", context, sf


def convert_hotpotqa(rec: dict, split: str, setting: str | None = None) -> Converted:
    qid = record_id(rec, "_id", "id")
    layout, context, sf = _parallel_layout(rec, "sentences")
    docs = _titled_paragraphs(context, JOIN[HOTPOTQA])
    has_labels = sf is not None
    gold, titles, missing = _gold_by_titles(docs, sf) if has_labels else ([], [], [])
    meta = _meta(
        rec,
        {"_id", "id", "question", "answer", "type", "context", "supporting_facts"},
        supporting_facts=sf,  # always in the original [title, sentence] layout
        layout=layout,
        setting=setting,
        hops=len(titles) if has_labels else None,
        gold_titles_missing=missing or None,
    )
    answer = rec.get("answer")
    q = _question(qid, HOTPOTQA, split, rec, answer=answer, aliases=[], gold=gold, type_=rec.get("type"), answerable=True, meta=meta)
    return Converted(q, docs)


# ---------------------------------------------------------------------------------- 2WikiMultihopQA


def convert_2wiki(rec: dict, split: str, setting: str | None = None) -> Converted:
    qid = record_id(rec, "_id")
    layout, context, sf = _parallel_layout(rec, "content")
    if not isinstance(context, list):
        raise BadRecord("field 'context' has the wrong type", "expected a list of [title, sentences]")
    docs = _titled_paragraphs(context, JOIN[TWOWIKI])
    evidences = rec.get("evidences")
    if isinstance(evidences, dict):
        # Hugging Face copies: {fact, relation, entity} lists. Only their number is used (hops); they stay in
        # meta as given, not read as gold triples, since no source says which of them is the subject.
        hops = len(_rows(evidences, ("fact", "relation", "entity"), "evidences"))
    elif evidences is None or isinstance(evidences, list):
        hops = len(evidences) if evidences is not None else None
    else:
        raise BadRecord("field 'evidences' has the wrong type", "expected a list of [subject, relation, object]")
    gold, _, missing = _gold_by_titles(docs, sf) if sf is not None else ([], [], [])
    hf = {"supporting_facts": sf, "layout": layout} if layout == "hf" else {}  # facts in the original layout
    meta = _meta(
        rec,
        {"_id", "question", "answer", "type", "context", *hf},
        **hf,
        hops=hops,
        gold_titles_missing=missing or None,
    )
    q = _question(qid, TWOWIKI, split, rec, answer=rec.get("answer"), aliases=[], gold=gold, type_=rec.get("type"), answerable=True, meta=meta)
    return Converted(q, docs)


# ------------------------------------------------------------------------------------------ MuSiQue

_MUSIQUE_TYPE = re.compile(r"^(\d+hop\d*)__")
UNANSWERABLE_SUFFIX = "__unanswerable"


def convert_musique(rec: dict, split: str, setting: str | None = None) -> Converted:
    qid = record_id(rec, "id")
    paragraphs = _field(rec, "paragraphs", list)
    decomposition = _field(rec, "question_decomposition", list, optional=True, default=[])
    answerable = _field(rec, "answerable", bool, optional=True, default=True)
    aliases = _str_list(_field(rec, "answer_aliases", list, optional=True, default=[]), "answer_aliases")
    docs = []
    by_idx: dict[int, str] = {}
    supporting: list[int] = []
    for i, p in enumerate(paragraphs):
        if not isinstance(p, dict):
            raise BadRecord("field 'paragraphs' has the wrong type", f"paragraphs[{i}] is not an object")
        title = p.get("title")
        text = p.get("paragraph_text")
        idx = p.get("idx", i)
        if not isinstance(title, str) or not isinstance(text, str) or not isinstance(idx, int):
            raise BadRecord("field 'paragraphs' has the wrong type", f"paragraphs[{i}] needs str title, str paragraph_text, int idx")
        did = doc_id(title, text)
        docs.append((did, title, text))
        by_idx[idx] = did
        if p.get("is_supporting"):
            supporting.append(idx)
    hop_order = []
    for step in decomposition:
        if isinstance(step, dict) and isinstance(step.get("paragraph_support_idx"), int):
            hop_order.append(step["paragraph_support_idx"])
    gold: list[str] = []
    if answerable:
        order = [i for i in hop_order if i in supporting] + [i for i in supporting if i not in hop_order]
        gold = _unique([by_idx[i] for i in order])
    m = _MUSIQUE_TYPE.match(qid)
    meta = _meta(
        rec,
        {"id", "question", "answer", "answer_aliases", "answerable", "paragraphs"},
        hops=len(decomposition),
        supporting_idx=supporting,
        musique_id=None if answerable else qid,
        # No gold to offer: `chains synthesize --unanswerable keep` offers these paragraphs' triples instead.
        context_doc_ids=None if answerable else _unique([did for did, _, _ in docs]),
    )
    # MuSiQue-full pairs every answerable question with an unanswerable twin under the same id.
    key = qid if answerable else qid + UNANSWERABLE_SUFFIX
    q = _question(key, MUSIQUE, split, rec, answer=rec.get("answer"), aliases=aliases, gold=gold, type_=m.group(1) if m else None, answerable=answerable, meta=meta)
    return Converted(q, docs)


# ---------------------------------------------------------------------------------------- MoreHopQA

_HOTPOT_ID = re.compile(r"^[0-9a-f]{24}(_\d+)?$")
_TWOWIKI_ID = re.compile(r"^[0-9a-f]{32}(_\d+)?$")
_MUSIQUE_ID = re.compile(r"^\d+hop\d*__")


def morehopqa_source(qid: str) -> str | None:
    """The dataset a MoreHopQA question was built from, read from its id (original id + ``_N``)."""
    if _HOTPOT_ID.match(qid):
        return HOTPOTQA
    if _TWOWIKI_ID.match(qid):
        return TWOWIKI
    if _MUSIQUE_ID.match(qid):
        return MUSIQUE
    return None


def convert_morehopqa(rec: dict, split: str, setting: str | None = None) -> Converted:
    context, decomposition = rec.get("context"), rec.get("question_decomposition")
    layout = "hf" if isinstance(context, dict) else "original"
    if layout == "hf":  # the Hugging Face features: sequences of structs as dicts of parallel lists, no `_id`
        context = _rows(context, ("title", "paragraphs"), "context")
        if isinstance(decomposition, dict):
            titles = _rows(decomposition, ("paragraph_support_title",), "question_decomposition")
            decomposition = [{"paragraph_support_title": t} for (t,) in titles]
    derived_qid = layout == "hf" and rec.get("_id") is None
    qid = _question_hash(_field(rec, "question", str)) if derived_qid else record_id(rec, "_id")
    source = morehopqa_source(qid)
    if context is None:
        raise BadRecord("missing field 'context'")
    if not isinstance(context, list):
        raise BadRecord("field 'context' has the wrong type", "expected a list of [title, paragraphs]")
    docs = _titled_paragraphs(context, JOIN.get(source or MOREHOPQA, " "))
    if decomposition is None:
        decomposition = []
    if not isinstance(decomposition, list):
        raise BadRecord("field 'question_decomposition' has the wrong type", "expected a list of sub-questions")
    by_title: dict[str, list[str]] = {}
    for did, title, _ in docs:
        by_title.setdefault(title, []).append(did)
    hop_titles = [s.get("paragraph_support_title") for s in decomposition if isinstance(s, dict)]
    ordered = [did for t in hop_titles if isinstance(t, str) for did in by_title.get(t, [])]
    gold = _unique(ordered + [did for did, _, _ in docs])
    hops = rec.get("no_of_hops")
    meta = _meta(
        rec,
        {"_id", "question", "answer", "context"},
        source_dataset=source,
        hops=hops if isinstance(hops, int) else None,
        layout=layout if layout == "hf" else None,
        qid_from="question" if derived_qid else None,
    )
    q = _question(qid, MOREHOPQA, split, rec, answer=rec.get("answer"), aliases=[], gold=gold, type_=rec.get("reasoning_type"), answerable=True, meta=meta)
    return Converted(q, docs)


def _question_hash(question: str) -> str:
    """A question id made from the question's text, for a layout that carries none (stable across runs)."""
    return "q-" + hashlib.blake2b(question.encode("utf-8"), digest_size=8).hexdigest()


# -------------------------------------------------------------------------------------- generic layout

GENERIC_QUESTION_KEYS = ("qid", "question", "answer")  # `id` may stand for `qid`


def _generic_answer(rec: dict) -> tuple[str, list[str]]:
    """``answer`` as a string, or a list whose first item is the answer and the rest aliases."""
    if "answer" not in rec or rec["answer"] is None:
        raise BadRecord("missing field 'answer'")
    answer = rec["answer"]
    if isinstance(answer, str):
        return answer, []
    if isinstance(answer, list) and answer and all(isinstance(a, str) for a in answer):
        return answer[0], answer[1:]
    raise BadRecord("field 'answer' has the wrong type", "expected a string or a non-empty list of strings")


def _generic_gold(rec: dict) -> tuple[str, list[str]] | None:
    """``("id", ids)`` or ``("title", titles)`` in hop order; None when the question names no gold documents."""
    given = [k for k in ("gold_doc_ids", "gold_titles") if rec.get(k) is not None]
    if len(given) > 1:
        raise BadRecord("fields 'gold_doc_ids' and 'gold_titles' are both given", "name the gold documents one way")
    if not given:
        return None
    key = given[0]
    values = rec[key]
    if not isinstance(values, list):
        raise BadRecord(f"field '{key}' has the wrong type", "expected a list")
    if key == "gold_titles":
        return "title", _unique(_str_list(values, key))
    return "id", _unique([record_id({key: v}, key) for v in values])


def convert_generic(rec: dict, split: str, setting: str | None = None) -> Converted:
    """A question of the generic layout; its gold documents are resolved later (``Converted.gold_refs``)."""
    qid = record_id(rec, "qid", "id")
    answer, from_list = _generic_answer(rec)
    aliases = _str_list(_field(rec, "aliases", list, optional=True, default=[]), "aliases")
    own_split = normalize_split(_field(rec, "split", str, optional=True))
    answerable = _field(rec, "answerable", bool, optional=True, default=True)
    refs = _generic_gold(rec)
    meta = _meta(
        rec,
        {"qid", "id", "question", "answer", "aliases", "split", "type", "answerable", "gold_doc_ids"},
        gold_ids=refs[1] if refs and refs[0] == "id" else None,  # the ids as given (gold_titles stays as given)
        hops=len(refs[1]) if refs else None,
    )
    q = _question(qid, GENERIC, own_split or split, rec, answer=answer, aliases=_unique(from_list + aliases), gold=[], type_=rec.get("type"), answerable=answerable, meta=meta)
    return Converted(q, [], gold_refs=refs)


def convert_generic_document(rec: dict, split: str, setting: str | None = None) -> Converted:
    """A document of the generic layout: ``text`` with an ``id`` (or ``doc_id``, grtool's own column name), a
    ``title`` or both (no title: the empty one)."""
    if rec.get("id") is not None and rec.get("doc_id") is not None:
        raise BadRecord("fields 'id' and 'doc_id' are both given", "name the document one way")
    key = "doc_id" if rec.get("doc_id") is not None else "id"
    if rec.get(key) is None and rec.get("title") is None:
        raise BadRecord("missing field 'id' or 'title'", "a document needs one of them to be named by the questions")
    own_id = record_id(rec, key) if rec.get(key) is not None else None
    title = _field(rec, "title", str, optional=True, default="")
    text = _field(rec, "text", str)
    if not text.strip():
        raise BadRecord("empty document text", "the document's text is empty or blank")
    return Converted(None, [(doc_id(title, text), title, text)], source_id=own_id)


# --------------------------------------------------------------------------------------- inline layout

INLINE_PARAGRAPH_KEYS = ("title", "text", "is_supporting")


def _inline_paragraphs(value: Any) -> list[dict]:
    """``paragraphs`` as a list of objects; a Hugging Face sequence of structs (a dict of parallel lists) too."""
    if isinstance(value, dict):
        keys = tuple(k for k in INLINE_PARAGRAPH_KEYS if k in value)
        return [dict(zip(keys, row)) for row in _rows(value, keys, "paragraphs")]
    if not isinstance(value, list):
        raise BadRecord("field 'paragraphs' has the wrong type", "expected a list of {title, text, is_supporting}")
    return value


def convert_inline(rec: dict, split: str, setting: str | None = None) -> Converted:
    """A question with its paragraphs inline: every paragraph is a document, those with ``is_supporting`` are the
    gold documents in the order given (the hop order). No ``qid``/``id``: the qid is a hash of the question."""
    derived_qid = rec.get("qid") is None and rec.get("id") is None
    qid = _question_hash(_field(rec, "question", str)) if derived_qid else record_id(rec, "qid", "id")
    answer, from_list = _generic_answer(rec)
    aliases = _str_list(_field(rec, "aliases", list, optional=True, default=[]), "aliases")
    own_split = normalize_split(_field(rec, "split", str, optional=True))
    answerable = _field(rec, "answerable", bool, optional=True, default=True)
    docs, gold = [], []
    for i, p in enumerate(_inline_paragraphs(_field(rec, "paragraphs", (list, dict)))):
        if not isinstance(p, dict):
            raise BadRecord("field 'paragraphs' has the wrong type", f"paragraphs[{i}] is not an object")
        title, text, supporting = p.get("title") or "", p.get("text"), p.get("is_supporting", False)
        if not isinstance(title, str) or not isinstance(text, str) or not isinstance(supporting, bool):
            raise BadRecord("field 'paragraphs' has the wrong type", f"paragraphs[{i}] needs str text, str title (optional), bool is_supporting (optional)")
        if not text.strip():
            raise BadRecord("empty document text", f"paragraphs[{i}] has no text")
        did = doc_id(title, text)
        docs.append((did, title, text))
        if supporting:
            gold.append(did)
    gold = _unique(gold) if answerable else []
    meta = _meta(
        rec,
        set(READS[INLINE]),
        hops=len(gold),
        qid_from="question" if derived_qid else None,
        # as for MuSiQue-full: `chains synthesize --unanswerable keep` offers these paragraphs' triples
        context_doc_ids=None if answerable else _unique([did for did, _, _ in docs]),
    )
    q = _question(qid, GENERIC, own_split or split, rec, answer=answer, aliases=_unique(from_list + aliases), gold=gold, type_=rec.get("type"), answerable=answerable, meta=meta)
    return Converted(q, docs)


# ------------------------------------------------------------------------------ HotpotQA Wikipedia dump


def convert_wiki(rec: dict, split: str, setting: str | None = None) -> Converted:
    """A ``{title, text}`` document: an article of the dump, or of another corpus file (text a string)."""
    title = _field(rec, "title", str)
    body = _field(rec, "text", (list, str))
    text = body if isinstance(body, str) else "".join(_str_list(body, "text"))
    return Converted(None, [(doc_id(title, text), title, text)])


class _Article(msgspec.Struct):
    title: str
    text: list[str] | str


_decode_article = msgspec.json.Decoder(_Article).decode


def convert_wiki_line(line: bytes) -> Converted | None:
    """The dump's hot path: decode only ``title`` and ``text`` of a JSON line (the dump's character offsets
    are most of its bytes and are never used). None when the line does not fit: the general path then says
    what is wrong with it."""
    try:
        article = _decode_article(line)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    text = article.text if isinstance(article.text, str) else "".join(article.text)
    return Converted(None, [(doc_id(article.title, text), article.title, text)])


# Converters that take an undecoded JSON line, where one is faster than decoding the whole record.
LINE_CONVERTERS: dict[str, Callable[[bytes], Converted | None]] = {HOTPOTQA_WIKI: convert_wiki_line}


CONVERTERS: dict[str, Callable[..., Converted]] = {
    HOTPOTQA: convert_hotpotqa,
    TWOWIKI: convert_2wiki,
    MUSIQUE: convert_musique,
    MOREHOPQA: convert_morehopqa,
    HOTPOTQA_WIKI: convert_wiki,
    GENERIC: convert_generic,
    GENERIC_DOCUMENTS: convert_generic_document,
    INLINE: convert_inline,
}


# The keys each converter reads (for a column, the gold list, the documents or a count); a question record's other
# keys are kept in its ``meta`` as given, a document record's are not kept. The ingest summary names those keys.
READS: dict[str, tuple[str, ...]] = {
    HOTPOTQA: ("_id", "id", "question", "answer", "type", "context", "supporting_facts"),
    TWOWIKI: ("_id", "question", "answer", "type", "context", "supporting_facts", "evidences"),
    MUSIQUE: ("id", "question", "answer", "answer_aliases", "answerable", "paragraphs", "question_decomposition"),
    MOREHOPQA: ("_id", "question", "answer", "context", "question_decomposition", "no_of_hops", "reasoning_type"),
    HOTPOTQA_WIKI: ("title", "text"),
    GENERIC: ("qid", "id", "question", "answer", "aliases", "split", "type", "answerable", "gold_doc_ids", "gold_titles"),
    GENERIC_DOCUMENTS: ("id", "doc_id", "title", "text"),
    INLINE: ("qid", "id", "question", "answer", "aliases", "split", "type", "answerable", "paragraphs"),
}


# The keys read of each paragraph object, where a converter reads paragraphs as objects and keeps none of them in
# the question's meta: any other key is named as ``paragraphs[].KEY`` (MuSiQue's `question_decomposition` and
# MoreHopQA's are kept in meta whole, so nothing of theirs goes unread).
PARAGRAPH_READS: dict[str, frozenset[str]] = {
    INLINE: frozenset(INLINE_PARAGRAPH_KEYS),
    MUSIQUE: frozenset({"idx", "title", "paragraph_text", "is_supporting"}),
}


def unread_keys(converter: str, rec: dict) -> list[str]:
    """The keys of ``rec`` its converter does not read (a paragraph's as ``paragraphs[].KEY``)."""
    read = READS[converter]
    unread = [k for k in rec if k not in read]
    inner_read = PARAGRAPH_READS.get(converter)
    if inner_read is not None and isinstance(rec.get("paragraphs"), list):
        inner = {k for p in rec["paragraphs"] if isinstance(p, dict) for k in p if k not in inner_read}
        unread += [f"paragraphs[].{k}" for k in sorted(inner)]
    return unread


@dataclass(frozen=True)
class Shape:
    """What a record looks like: one dataset's release format, or a shape several datasets share (``dataset``
    None: the file's dataset must be named with --dataset, never guessed)."""

    dataset: str | None
    documents: bool  # titled documents without questions (a corpus file)
    looks_like: str  # for messages
    choices: tuple[str, ...] = ()  # the datasets an ambiguous shape may be


QUESTION_DATASETS = (HOTPOTQA, TWOWIKI, MUSIQUE, MOREHOPQA)
DOCUMENT_LABELS = (*QUESTION_DATASETS, GENERIC)  # what a file of {title, text} documents may be tagged with
_MOREHOPQA_KEYS = {"previous_question", "no_of_hops", "reasoning_type", "ques_on_last_hop"}
_HOTPOTQA_TEST_KEYS = {"_id", "question", "context"}  # HotpotQA's test files carry only these


def detect(rec: Any) -> Shape | None:
    """The shape of a release record, from keys that only one release format has (None: not a known shape).

    - MuSiQue: ``question`` with ``paragraphs`` (objects with ``paragraph_text``).
    - The inline layout: ``question`` with ``paragraphs`` whose first one has ``text`` and no ``paragraph_text``.
    - MoreHopQA: ``question`` and ``context`` with one of its own keys (``previous_question``, ``no_of_hops``, ...).
    - 2WikiMultihopQA: ``_id``, ``question``, ``context`` with ``evidences`` or ``entity_ids``.
    - HotpotQA: ``_id`` (``id`` in the Hugging Face layout), ``question``, ``context`` with ``supporting_facts``,
      ``level`` or a context of parallel lists (Hugging Face); or exactly ``_id``, ``question``, ``context`` (test).
    - The HotpotQA Wikipedia abstracts dump: ``title``, ``url`` and ``text`` as a list of sentences.
    - The generic layout: questions with ``qid`` (or ``id``), ``question`` and ``answer`` and no context;
      documents with ``id`` and ``text`` (and perhaps ``title``).
    Any other ``{title, text}`` record is a document of an unknown corpus (HippoRAG-style corpus files of every
    dataset look like that), and a question with a [title, sentences] context but none of the keys above may
    be HotpotQA's or 2Wiki's: both are ambiguous.
    """
    if not isinstance(rec, dict):
        return None
    keys = set(rec)
    if "question" in keys:
        if "paragraphs" in keys:
            if _inline_first_paragraph(rec["paragraphs"]):
                return Shape(INLINE, False, "questions with inline paragraphs")
            return Shape(MUSIQUE, False, "MuSiQue questions")
        if "context" not in keys:
            if "answer" in keys and keys & {"qid", "id"}:
                return Shape(GENERIC, False, "generic questions")
            return None
        if keys & _MOREHOPQA_KEYS:
            return Shape(MOREHOPQA, False, "MoreHopQA questions")
        if "_id" in keys and keys & {"evidences", "entity_ids"}:
            return Shape(TWOWIKI, False, "2WikiMultihopQA questions")
        hotpot_only = keys & {"supporting_facts", "level"} or isinstance(rec.get("context"), dict)
        if (("_id" in keys or "id" in keys) and hotpot_only) or keys == _HOTPOTQA_TEST_KEYS:
            return Shape(HOTPOTQA, False, "HotpotQA questions")
        return Shape(None, False, "questions with a [title, sentences] context", (HOTPOTQA, TWOWIKI))
    if "title" in keys and "text" in keys and "url" in keys and isinstance(rec["text"], list):
        return Shape(HOTPOTQA_WIKI, True, "the HotpotQA Wikipedia abstracts dump")
    if "text" in keys and keys & {"id", "doc_id"} and "url" not in keys:  # (other dumps carry a url: left ambiguous)
        return Shape(GENERIC_DOCUMENTS, True, "generic documents")
    if "title" in keys and "text" in keys:
        return Shape(None, True, "a list of {title, text} documents", DOCUMENT_LABELS)
    return None


def _inline_first_paragraph(paragraphs: Any) -> bool:
    """The first paragraph (or the parallel lists) of the inline layout: ``text``, not MuSiQue's ``paragraph_text``."""
    first = paragraphs[0] if isinstance(paragraphs, list) and paragraphs else paragraphs
    return isinstance(first, dict) and "text" in first and "paragraph_text" not in first


_SPLIT = re.compile(r"(?<![a-z])(train|dev|test|validation|val)(?![a-z])")


def normalize_split(value: str | None) -> str | None:
    """A split name as a record gives it, in grtool's words: case and surrounding blanks do not count, and
    ``validation`` (``val``, ``valid``, ``development``) is ``dev``, as in file names (:func:`split_from_name`);
    ``training`` and ``testing`` are ``train`` and ``test``. A control character in it is a damaged record."""
    if value is None:
        return None
    name = canonical_split(value)
    if not name:
        raise BadRecord("field 'split' is blank", "give a split name (train, dev, test) or leave the field out")
    if not name.isprintable():
        raise BadRecord("field 'split' holds a control character", "a split name is printable text (train, dev, test)")
    return name


def given_split(value: str, flag: str) -> str:
    """A split name given on the command line, normalised as a record's (:func:`normalize_split`); a name that
    changes is said once, so `--split Validation` writing ``dev`` is no surprise."""
    from grtool.errors import InputError
    from grtool.log import log

    try:
        name = normalize_split(value)
    except BadRecord as e:  # blank, or a control character in it
        said = e.reason.replace("field 'split'", "a split name")
        raise InputError(f"{flag} {value!r}: {said}; give one such as train, dev or test") from None
    if name != value:
        log.info("%s %r is read as %r (%s)", flag, value, name, SPLIT_RULE)
    return name


def split_from_name(name: str) -> str | None:
    """``hotpot_dev_distractor_v1.json`` → ``dev``; ``validation`` counts as ``dev``."""
    m = _SPLIT.search(name.lower())
    if not m:
        return None
    return {"validation": "dev", "val": "dev"}.get(m.group(1), m.group(1))


def setting_from_name(name: str) -> str | None:
    low = name.lower()
    for s in ("distractor", "fullwiki"):
        if s in low:
            return s
    return None
