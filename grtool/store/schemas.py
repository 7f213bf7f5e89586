"""Arrow schemas of the tables stages exchange (DESIGN §3), with their keys."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from grtool.store.layout import TABLE_NAMES, name_table

STR = pa.string()
STR_LIST = pa.list_(pa.string())

DOCUMENTS = pa.schema(
    [
        ("doc_id", STR),
        ("title", STR),
        ("text", STR),
        ("datasets", STR_LIST),
    ]
)

QUESTIONS = pa.schema(
    [
        ("qid", STR),
        ("dataset", STR),
        ("split", STR),
        ("question", STR),
        ("answer", STR),
        ("answer_aliases", STR_LIST),
        ("gold_doc_ids", STR_LIST),  # hop order where the dataset gives it
        ("type", STR),
        ("answerable", pa.bool_()),
        ("meta", STR),  # JSON text of dataset-specific fields
    ]
)

TRIPLES = pa.schema(
    [
        ("doc_id", STR),
        ("idx", pa.int32()),
        ("head", STR),
        ("relation", STR),
        ("tail", STR),
        ("docid", STR),  # rendered "<docid_start>head, relation, tail<docid_end>"
    ]
)

LLM_CALLS = pa.schema(
    [
        ("request_hash", STR),
        ("row_key", STR),  # the doc_id / qid the call was made for
        ("model", STR),
        ("prompt", STR),  # JSON text of the chat messages
        ("sampling", STR),  # JSON text of every sampling parameter
        ("output", STR),
        ("finish_reason", STR),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("logprobs_summary", STR),  # JSON text (mean logprob, tokens with logprobs) or null
        ("cached", pa.bool_()),
    ]
)

CHAINS = pa.schema(
    [
        ("qid", STR),
        ("candidate", pa.int32()),
        ("text", STR),
        ("docids", STR_LIST),  # in order of retrieval, normalized to the docid markers
        ("flipped", pa.list_(pa.bool_())),  # per docid: written tail-to-head against the stored triple
        ("selected", pa.bool_()),
        ("score", pa.float64()),
        ("model", STR),
        ("temperature", pa.float64()),
        ("finish_reason", STR),
    ]
)

RESPONSES = pa.schema(
    [
        ("qid", STR),
        ("sample", pa.int32()),
        ("dataset", STR),
        ("text", STR),
        ("docids", STR_LIST),  # well-formed docids as written, markers included, in order
        ("flipped", pa.list_(pa.bool_())),  # per docid: found only when read tail-first
        ("doc_ids", STR_LIST),  # the documents those docids retrieve (GMR: the documents generated), first seen first
        ("n_docids", pa.int32()),
        ("malformed", pa.int32()),
        ("tokens", pa.int32()),  # generated tokens
        ("latency_ms", pa.float64()),  # until the response was ready (its batch or chunk)
        ("finish_reason", STR),
        ("model", STR),
        ("markers", STR),  # special | brackets
        ("mode", STR),  # docids | gmr
    ]
)

ANSWERS = pa.schema(
    [
        ("qid", STR),
        ("dataset", STR),
        ("question", STR),
        ("doc_ids", STR_LIST),  # the documents the reader was given: the response's, in its order
        ("text", STR),  # what the reader wrote
        ("prediction", STR),  # its first line, an "Answer:" prefix removed: what is scored
        ("answers", STR_LIST),  # the gold answer, then its aliases
        ("exact_match", pa.float64()),  # SQuAD v1.1, best over the answers
        ("f1", pa.float64()),
        ("tokens", pa.int32()),
        ("latency_ms", pa.float64()),
        ("finish_reason", STR),
        ("model", STR),
        ("judge_model", STR),  # --judge: the model that judged the prediction (null without --judge)
        ("judge_text", STR),  # what the judge wrote
        ("judged_correct", pa.bool_()),  # its verdict: yes / no; null when it said neither
    ]
)

# Every table by name: its schema and its key (the columns that identify a row). grtool's own, then those commands
# declare (register_table).
TABLES: dict[str, tuple[pa.Schema, tuple[str, ...]]] = {
    "documents": (DOCUMENTS, ("doc_id",)),
    "questions": (QUESTIONS, ("qid",)),
    "triples": (TRIPLES, ("doc_id", "idx")),
    "llm_calls": (LLM_CALLS, ("request_hash", "row_key")),
    "chains": (CHAINS, ("qid", "candidate")),
    "responses": (RESPONSES, ("qid", "sample")),
    "answers": (ANSWERS, ("qid",)),
}
if tuple(TABLES) != TABLE_NAMES:  # the records' readers know the tables by those names alone
    raise ImportError(f"grtool.store.layout.TABLE_NAMES {TABLE_NAMES} differs from the schemas {tuple(TABLES)}")


@dataclass(frozen=True)
class TableView:
    """How `grtool show` prints a row of a table: beside its key, its ``text`` column (None: it has none) and the
    ``fields`` columns, labelled. The tables whose rows hold docids (chains, responses, triples) are shown with
    their verdicts (grtool/inspect/rows.py); every other table by this view."""

    text: str | None = None
    fields: tuple[str, ...] = ()


# grtool's own tables that `show` prints by their view (a corpus's questions are shown with their gold documents)
VIEWS: dict[str, TableView] = {
    "documents": TableView("text", ("title", "datasets")),
    "questions": TableView(None, ("type", "answerable")),
    "llm_calls": TableView("output", ("model", "finish_reason", "prompt_tokens", "completion_tokens", "cached")),
    "answers": TableView("text", ("prediction", "answers", "exact_match", "f1", "judged_correct", "model")),
}


def register_table(name: str, schema: pa.Schema, key: tuple[str, ...], *, text: str | None = None, fields: tuple[str, ...] | None = None) -> None:
    """Declare the table a command writes (its stage directories' manifests name it): `validate`, `status` and the
    readers then check its shards against ``schema`` and its rows' ``key`` as they do grtool's own, and `show`
    prints its rows: the key, the ``text`` column and the ``fields`` (default: every other column). Declared once,
    beside the command (a second declaration of the same name must be the same)."""
    key = tuple(key)
    missing = [k for k in key if k not in schema.names]
    if not key or missing:
        raise ValueError(f"table {name!r}: its key {list(key)} names no column of its schema{f' ({missing})' if missing else ''}")
    view_given = text is not None or fields is not None
    fields = tuple(n for n in schema.names if n not in key and n != text) if fields is None else tuple(fields)
    unknown = [c for c in (text, *fields) if c is not None and c not in schema.names]
    if unknown:
        raise ValueError(f"table {name!r}: the columns shown {unknown} are not in its schema")
    if text is not None and not (pa.types.is_string(schema.field(text).type) or pa.types.is_large_string(schema.field(text).type)):
        raise ValueError(f"table {name!r}: its text column {text!r} holds {schema.field(text).type}, not text")
    view = TableView(text, fields)
    if name in TABLES:  # declared again: the same table (a view given must be the one it has)
        if TABLES[name][0].equals(schema) and TABLES[name][1] == key and (not view_given or VIEWS.get(name) == view):
            return
        raise ValueError(f"table {name!r} is declared already, with another {'schema, key or view' if view_given else 'schema or key'}")
    name_table(name)
    TABLES[name] = (schema, key)
    VIEWS[name] = view


def schema_of(table: str) -> pa.Schema:
    return TABLES[table][0]


def key_of(table: str) -> tuple[str, ...]:
    return TABLES[table][1]
