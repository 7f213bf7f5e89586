"""The rows `grtool show` prints: picked from a stage (by qid, a seeded sample, or the rejects of one filter rule),
joined with their questions, the documents' titles and the verdict of every docid.

A docid's verdict, for the row's question: **gold** when a document holding its triple is a gold document of the
question, **non-gold** when the triple is stored but only in other documents, **hallucinated** when no stored
triple has that key (as written or tail-first: the filters and `eval recall` read docids the same way), and
**unchecked** when no triples stage is known; a marked span that is no docid (a marker never closed, an empty
span, not a triple) is **malformed**. A table whose rows hold no docids (questions, documents, a table a command
declared) is shown by its view (:class:`grtool.store.schemas.TableView`): its key, text and fields. Reading is
bounded by what is shown: only the needed columns, the row groups of a sample, the questions and documents of
those rows.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from grtool.errors import InputError
from grtool.inspect.sources import DOCID_KINDS, Source
from grtool.store.layout import REJECTS_DIR
from grtool.store.reading import scan_shards
from grtool.store.records import Manifest
from grtool.store.schemas import VIEWS, TableView, key_of
from grtool.vocab.provenance import ExportRecord

GOLD, NON_GOLD, HALLUCINATED, UNCHECKED, MALFORMED = "gold", "non-gold", "hallucinated", "unchecked", "malformed"
VERDICTS = (GOLD, NON_GOLD, HALLUCINATED, UNCHECKED, MALFORMED)

# Columns shown beside a row's text, per kind (the rest are in the stage for `grtool status` or Parquet readers).
FIELDS = {
    "chains": ("selected", "score", "model", "temperature", "finish_reason"),
    "filtered": ("selected", "score", "model", "finish_reason"),
    "responses": ("n_docids", "malformed", "tokens", "finish_reason", "model", "markers", "mode"),
    "triples": (),
    "export": ("label",),
}


@dataclass
class Doc:
    doc_id: str
    title: str | None  # None: not in the documents stage (or none known)
    gold: bool = False


@dataclass
class Docid:
    text: str  # as written, markers included
    start: int  # position in the row's text (-1: in the docids column only)
    end: int
    verdict: str
    flipped: bool = False  # found only read tail-first
    documents: list[Doc] = field(default_factory=list)  # the documents holding its triple


@dataclass
class Question:
    qid: str
    dataset: str | None
    split: str | None
    question: str
    answer: str | None
    gold: list[Doc]


@dataclass
class Row:
    kind: str
    key: dict[str, Any]  # what names the row: qid and candidate, qid and sample, doc_id and idx, line, a table's key
    text: str | None  # None: a table whose view has no text column
    fields: dict[str, Any]
    question: Question | None = None
    docids: list[Docid] = field(default_factory=list)
    retrieved: list[Doc] | None = None  # responses: the documents their docids retrieve (doc_ids column)
    rejected: dict[str, Any] | None = None  # --reason: the reason codes and the filter's detail
    prompt: str | None = None  # exports: the prompt (its question is matched to the corpus)


@dataclass(frozen=True)
class Pick:
    """Which rows: ``qids`` (any of them), else a seeded sample of ``sample`` rows, else the first ``limit``;
    ``reason``: the stage's rejected rows with a reason code of that rule instead of its rows."""

    qids: tuple[str, ...] = ()
    sample: int | None = None
    seed: int = 0
    limit: int = 10
    reason: str | None = None


def load_rows(source: Source, pick: Pick) -> list[Row]:
    """The picked rows, joined and judged."""
    if pick.qids and not source.by_question:
        raise InputError(f"{source.path}: --qid picks rows by their question; a {source.kind} table has no qid column")
    if source.kind == "export":
        raw = _export_rows(source, pick)
    elif pick.reason is not None:
        raw = _rejected_rows(source, pick)
    else:
        raw = _stage_rows(source, pick)
    rows = [_row(source, r) for r in raw]
    _join(source, rows, raw)
    return rows


# ----------------------------------------------------------------------------------------------- picking


def _take(items: Iterator[dict[str, Any]] | list[dict[str, Any]], pick: Pick) -> list[dict[str, Any]]:
    """A seeded sample of ``pick.sample`` items (in their order), or the first ``pick.limit`` (0: all)."""
    items = list(items) if pick.sample is not None else items
    if pick.sample is not None:
        chosen = sorted(random.Random(pick.seed).sample(range(len(items)), min(pick.sample, len(items))))
        return [items[i] for i in chosen]
    out = []
    for item in items:
        if pick.limit and len(out) >= pick.limit:
            break
        out.append(item)
    return out


def _stage_rows(source: Source, pick: Pick) -> list[dict[str, Any]]:
    import polars as pl

    from grtool.store.reading import collect
    from grtool.store.stage import shard_paths

    shards = shard_paths(source.path)
    if not shards:
        return []
    if source.kind == "triples" and pick.qids:  # the triples of the questions' gold documents
        question_of = {d: qid for qid, q in _questions(source, pick.qids).items() for d in q["gold_doc_ids"] or []}
        frame = collect(scan_shards(shards).filter(pl.col("doc_id").is_in(list(question_of))), shards)
        rows = [{**r, "qid": question_of[r["doc_id"]]} for r in frame.to_dicts()]  # judged against that question
        return _take(rows, Pick(sample=pick.sample, seed=pick.seed, limit=0))
    if pick.qids:  # (a declared table may hold its qids as numbers: compared as text)
        frame = collect(scan_shards(shards).filter(pl.col("qid").cast(pl.String).is_in(list(pick.qids))), shards)
        return _take(frame.to_dicts(), Pick(sample=pick.sample, seed=pick.seed, limit=0))
    if pick.sample is not None:
        return _sampled(shards, pick.sample, pick.seed)
    limit = pick.limit or None
    return collect(scan_shards(shards).head(limit) if limit else scan_shards(shards), shards).to_dicts()


def _sampled(shards: list[Path], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` rows drawn with ``seed`` from every row of the shards, reading only the row groups that hold them."""
    from grtool.store.reading import open_shard, read_row_group

    groups = []  # (shard, row group, rows)
    for shard in shards:
        meta = open_shard(shard).metadata
        groups.extend((shard, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups))
    total = sum(rows for _, _, rows in groups)
    chosen = sorted(random.Random(seed).sample(range(total), min(n, total)))
    out, start, at = [], 0, 0
    for shard, g, rows in groups:
        wanted = []
        while at < len(chosen) and chosen[at] < start + rows:
            wanted.append(chosen[at] - start)
            at += 1
        if wanted:
            table = read_row_group(shard, g)
            out.extend(table.slice(i, 1).to_pylist()[0] for i in wanted)  # not take(): pyarrow.compute loads pandas
        start += rows
    return out


def reason_matches(code: str, rule: str) -> bool:
    """A reason code belongs to ``rule``: the code itself, or the rule's name before the code's suffix."""
    return code == rule or code.startswith(rule + "-")


def _rejected_rows(source: Source, pick: Pick) -> list[dict[str, Any]]:
    if source.kind == "triples" or source.kind == "export":
        raise InputError(f"--reason reads the rejects of a chains, filtered or responses stage; {source.path} is {source.kind}")
    rule, wanted = pick.reason, set(pick.qids)
    files = sorted((source.path / REJECTS_DIR).glob("part-*.jsonl"))

    def matching() -> Iterator[dict[str, Any]]:
        for f in files:
            with open(f, "rb") as handle:
                for lineno, line in enumerate(handle, 1):
                    try:
                        entry = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        raise InputError(f"{f}, line {lineno}: not valid JSON (edited or damaged)") from None
                    record = entry.get("record") if isinstance(entry, dict) else None
                    if not isinstance(record, dict):
                        continue
                    codes = record.get("reasons") or [entry.get("reason")]
                    codes = [c for c in codes if isinstance(c, str)]
                    if not any(reason_matches(c, rule) for c in codes):
                        continue
                    if wanted and record.get("qid") not in wanted:
                        continue
                    yield {**record, "_rejected": {"reasons": codes, "detail": entry.get("detail") or ""}}

    rows = _take(matching(), pick)
    if not rows and not wanted:
        counted = source.manifest.counters.rejected if isinstance(source.manifest, Manifest) else {}
        reasons = ", ".join(f"{k} ({v})" for k, v in sorted(counted.items())) or "none"
        raise InputError(f"{source.path}: no rejected row has a reason of {rule!r}; its rejects by reason: {reasons}")
    return rows


# ----------------------------------------------------------------------------------------------- exports


def _export_rows(source: Source, pick: Pick) -> list[dict[str, Any]]:
    """Rows of an exported file (a JSON array or JSON Lines) as prompt, response and label."""
    if pick.reason is not None:
        raise InputError("--reason reads the rejects of a stage directory; an exported file has none")
    from grtool.jsonrecords import RecordsError, iter_json_records

    path = source.path
    try:
        items = [item for _, item in iter_json_records(path, isinstance(source.manifest, ExportRecord) and source.manifest.json_array)]
    except OSError as e:
        raise InputError(f"{path}: cannot read the exported rows ({e.strerror or e})") from None
    except RecordsError as e:
        raise InputError(f"{path}: cannot read the exported rows ({e})") from None
    rows = []
    for i, item in enumerate(items, 1):
        prompt, response, label = _conversation(item)
        rows.append({"line": i, "prompt": prompt, "text": response, "label": label, "question_text": question_of_prompt(prompt)})
    if pick.qids:
        texts = {q["question"].strip() for q in _questions(source, pick.qids).values()}
        rows = [r for r in rows if r["question_text"] in texts]
        return _take(rows, Pick(sample=pick.sample, seed=pick.seed, limit=0))
    return _take(rows, pick)


def _conversation(item: Any) -> tuple[str, str, Any]:
    """(prompt, response, label) of one row of any export format (LLaMA-Factory alpaca or sharegpt, TRL)."""
    if not isinstance(item, dict):
        return "", "", None
    if "instruction" in item:
        return str(item.get("instruction") or ""), str(item.get("output") or ""), None
    if isinstance(item.get("conversations"), list):
        turns = [t for t in item["conversations"] if isinstance(t, dict)]
        user = [t.get("value", "") for t in turns if t.get("from") == "human"]
        bot = [t.get("value", "") for t in turns if t.get("from") == "gpt"]
        return (user[-1] if user else ""), (bot[-1] if bot else ""), item.get("kto_tag")
    if isinstance(item.get("messages"), list):
        return _last(item["messages"], "user"), _last(item["messages"], "assistant"), None
    prompt, completion = item.get("prompt"), item.get("completion")
    prompt = _last(prompt, "user") if isinstance(prompt, list) else str(prompt or "")
    completion = _last(completion, "assistant") if isinstance(completion, list) else str(completion or "")
    return prompt, completion, item.get("label")


def _last(messages: list[Any], role: str) -> str:
    said = [m.get("content", "") for m in messages if isinstance(m, dict) and m.get("role") == role]
    return str(said[-1]) if said else ""


def question_of_prompt(prompt: str) -> str:
    """The question a prompt asks (the instruction ends with ``Question: ...``; see grtool.export.formats)."""
    at = prompt.rfind("Question:")
    return prompt[at + len("Question:") :].strip() if at >= 0 else prompt.strip()


# ----------------------------------------------------------------------------------------------- joining


def _row(source: Source, raw: dict[str, Any]) -> Row:
    kind = source.kind
    if kind == "triples":
        key = {"doc_id": raw.get("doc_id"), "idx": raw.get("idx")}
        text = raw.get("docid") or ""
    elif kind == "export":
        key = {"line": raw["line"]}
        text = raw["text"]
    elif kind in DOCID_KINDS:
        key = {"qid": raw.get("qid"), ("sample" if kind == "responses" else "candidate"): raw.get("sample" if kind == "responses" else "candidate")}
        text = raw.get("text") or ""
    else:  # any other table, by its declared view; a rejected record with everything it holds
        view = VIEWS.get(kind, TableView())
        key = {name: raw.get(name) for name in key_of(kind)}
        text = (raw.get(view.text) or "") if view.text is not None else None  # a view's text column holds text
        shown = [n for n in raw if n != "_rejected" and n not in key and n != view.text] if "_rejected" in raw else view.fields
        fields = {name: raw.get(name) for name in shown if name in raw}
        return Row(kind, key, text, fields, rejected=raw.get("_rejected"))
    fields = {name: raw.get(name) for name in FIELDS[kind] if name in raw}
    row = Row(kind, key, text, fields, rejected=raw.get("_rejected"))
    row.prompt = raw.get("prompt")
    return row


def _join(source: Source, rows: list[Row], raws: list[dict[str, Any]]) -> None:
    """Questions, the verdict of every docid and the titles of every document the rows name."""
    from grtool.docid import MARKERS, SPECIAL, parse, scan, triple_key

    qids = {raw["qid"] for raw in raws if isinstance(raw.get("qid"), str)}
    questions = _questions(source, tuple(qids)) if qids else {}
    if source.kind == "export" and source.questions is not None:
        questions_by_text = _questions_by_text(source, {raw["question_text"] for raw in raws})
        for row, raw in zip(rows, raws):
            found = questions_by_text.get(raw["question_text"])
            if found is not None:
                row.key["qid"] = raw["qid"] = found["qid"]
                questions[found["qid"]] = found
    markers = _chain_markers(source.manifest) if source.kind in ("chains", "filtered") else SPECIAL
    spans_of = []
    for row, raw in zip(rows, raws):
        if source.kind not in DOCID_KINDS:
            spans = []  # a table shown by its view holds no docids
        elif source.kind == "triples":
            spans = [(row.text, 0, len(row.text), triple_key(raw.get("head") or "", raw.get("relation") or "", raw.get("tail") or ""))]
        else:
            wanted = raw.get("markers") if raw.get("markers") in MARKERS else None
            found = scan(row.text, markers) if source.kind in ("chains", "filtered") else parse(row.text, wanted).spans
            spans = [(row.text[s.start : s.end], s.start, s.end, s.key if s.problem is None else None) for s in found]
        spans_of.append(spans)
    resolved = iter(_resolve(source, [key for spans in spans_of for *_, key in spans if key is not None]) or ())
    for row, raw, spans in zip(rows, raws, spans_of):
        q = questions.get(raw.get("qid"))
        gold = set(q["gold_doc_ids"] or []) if q else set()
        for text, start, end, key in spans:
            if key is None:
                row.docids.append(Docid(text, start, end, MALFORMED))
                continue
            docs, flipped = next(resolved) if source.triples is not None else (None, False)
            if docs is None or (source.kind == "triples" and not q):  # a triple alone: no question to judge it by
                verdict = UNCHECKED
            elif not docs:
                verdict = HALLUCINATED
            else:
                verdict = GOLD if docs & gold else NON_GOLD
            row.docids.append(Docid(text, start, end, verdict, flipped, [Doc(d, None, d in gold) for d in sorted(docs or ())]))
        if q:
            row.question = Question(q["qid"], q.get("dataset"), q.get("split"), q.get("question") or "", q.get("answer"), [Doc(d, None, True) for d in q["gold_doc_ids"] or []])
        if source.kind == "responses" and raw.get("doc_ids") is not None:
            row.retrieved = [Doc(d, None, d in gold) for d in raw["doc_ids"]]
        if source.kind == "triples":
            row.key["title"] = None
    _titles(source, rows)


def _chain_markers(manifest: Manifest | ExportRecord):
    from grtool.docid import Markers

    recorded = manifest.params.get("markers")
    if isinstance(recorded, list) and len(recorded) == 2 and all(isinstance(m, str) and m for m in recorded):
        return Markers(*recorded)
    return Markers()


def _resolve(source: Source, keys: list[str]) -> list[tuple[frozenset[str], bool]] | None:
    """(documents, flipped) per docid key, None without a triples stage."""
    if source.triples is None:
        return None
    if not keys:
        return []
    from grtool.docid.lookup import hash_keys
    from grtool.docid.lookup_files import open_lookup

    lookup = open_lookup(source.triples)
    resolved = lookup.resolve(hash_keys(keys), rows=True)
    return [(lookup.doc_ids_of(d), f) for d, f in zip(resolved.docs, resolved.flipped)]


_QUESTION_COLUMNS = ["qid", "dataset", "split", "question", "answer", "gold_doc_ids"]


def _questions(source: Source, qids: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    if source.questions is None:
        return {}
    import polars as pl

    from grtool.store.reading import collect
    from grtool.store.stage import shard_paths

    shards = shard_paths(source.questions)
    if not shards:
        return {}
    frame = collect(scan_shards(shards).select(_QUESTION_COLUMNS).filter(pl.col("qid").is_in(list(qids))), shards)
    return {r["qid"]: r for r in frame.to_dicts()}


def _questions_by_text(source: Source, texts: set[str]) -> dict[str, dict[str, Any]]:
    """Questions by their text (exports hold no qid; the first question of a text stands for it)."""
    import polars as pl

    from grtool.store.reading import collect
    from grtool.store.stage import shard_paths

    shards = shard_paths(source.questions)
    if not shards or not texts:
        return {}
    frame = collect(scan_shards(shards).select(_QUESTION_COLUMNS).filter(pl.col("question").str.strip_chars().is_in(list(texts))), shards)
    found: dict[str, dict[str, Any]] = {}
    for r in frame.to_dicts():
        found.setdefault(r["question"].strip(), r)
    return found


def _titles(source: Source, rows: list[Row]) -> None:
    docs = [d for r in rows for d in _docs_of(r)]
    wanted = {d.doc_id for d in docs} | {r.key["doc_id"] for r in rows if r.kind == "triples" and r.key.get("doc_id")}
    if source.documents is None or not wanted:
        return
    titles = titles_of(source.documents, wanted)
    for d in docs:
        d.title = titles.get(d.doc_id)
    for r in rows:
        if r.kind == "triples":
            r.key["title"] = titles.get(r.key.get("doc_id"))


def titles_of(documents: Path, doc_ids: set[str]) -> dict[str, str]:
    """The titles of these documents, from a documents stage (only its doc_id and title columns are read)."""
    import polars as pl

    from grtool.store.reading import collect
    from grtool.store.stage import shard_paths

    shards = shard_paths(documents)
    if not shards or not doc_ids:
        return {}
    frame = collect(scan_shards(shards).select(["doc_id", "title"]).filter(pl.col("doc_id").is_in(list(doc_ids))), shards)
    return dict(zip(frame["doc_id"].to_list(), frame["title"].to_list()))


def _docs_of(row: Row) -> Iterator[Doc]:
    if row.question is not None:
        yield from row.question.gold
    for d in row.docids:
        yield from d.documents
    yield from row.retrieved or ()


def as_json(row: Row) -> dict[str, Any]:
    """One row as `show --json` prints it (one JSON object per line)."""
    from dataclasses import asdict

    return asdict(row)
