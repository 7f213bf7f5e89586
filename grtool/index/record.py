"""index.json, declared once (DESIGN §8, :mod:`grtool.records`): what `index build` writes and every reader of an
index decodes through. Types, enumerations and bounds are the declaration; rules between fields are checked in
``__post_init__``; rules between the record and the files beside it (the kind's and the source's files, the
tokenizer's marker ids) are checked by :func:`confirm` when the index is opened. A record that fails is one
:class:`~grtool.records.DamagedRecord` line naming the file and the field (exit 1): an edited record never
answers queries with other documents, or with none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from grtool.records import Count, DamagedRecord, FileName, PositiveCount, Seconds, Sha256, read_record

META = "index.json"
TOKENIZER = "tokenizer.json"
FORMAT = "grtool-index/1"
REBUILD = "rebuild it with `grtool index build`"
# The files each kind's search structure is made of (their names start so; index_bytes is their sum).
KIND_PREFIXES = {"fm": "fm_", "trie": "trie_", "numpy": "oracle_"}
SEARCH_PREFIXES = tuple(KIND_PREFIXES.values())
# Files every index holds: the tokenizer and the sequence -> documents map (grtool.index.base's layout).
COMMON_FILES = (TOKENIZER, "doc_ids.txt", "seq_docs_offsets.npy", "seq_docs.npy", "seq_lengths.npy")
DOCID_TABLE = "docids.parquet"  # --source docids only
FLIPS_FILE = "seq_flipped.npy"  # --flips only
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1e15)]  # finite (NaN fails every bound)
Digest = Sha256  # sha256 or blake3: both 64 hex digits, the one pattern of grtool.records


class FileEntry(msgspec.Struct, forbid_unknown_fields=False):
    bytes: Count
    sha256: Sha256 | None = None
    blake3: Digest | None = None  # indexes built before content digests: sizes only


class TokenizerSource(msgspec.Struct):
    name: str
    bytes: Count
    blake3: Digest


class TokenizerInfo(msgspec.Struct):
    spec: str
    sha256: Sha256
    vocab_size: PositiveCount
    docid_start_id: Count
    docid_end_id: Count
    added_markers: bool = False
    source: TokenizerSource | None = None

    def __post_init__(self) -> None:
        if self.docid_start_id == self.docid_end_id:
            raise ValueError("docid_start_id and docid_end_id are the same id; the two markers are two tokens")
        for name in ("docid_start_id", "docid_end_id"):
            if getattr(self, name) >= self.vocab_size:
                raise ValueError(f"{name} {getattr(self, name)} is not below vocab_size {self.vocab_size}")


class Params(msgspec.Struct):
    """Build parameters; which are set depends on the kind (checked by :meth:`IndexRecord.__post_init__`)."""

    flips: bool = False
    # fm
    n: Count | None = None
    levels: PositiveCount | None = None
    sample_rate: PositiveCount | None = None
    sigma: Count | None = None
    dollar_row: Count | None = None
    memory_limit: Annotated[str, msgspec.Meta(max_length=64)] | Count | None = None  # fm: --memory-limit as given
    # trie
    prefixes: Count | None = None


class Sizes(msgspec.Struct):
    sequences: Count
    tokens: Count
    documents: Count | None = None
    max_sequence_tokens: Count = 0
    collisions: Count = 0
    index_bytes: Count = 0
    bits_per_token: Ratio | None = None
    total_bytes: Count | None = None
    flipped_sequences: Count = 0
    flipped_tokens: Count = 0
    flips_token_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    # what the build read but did not index (docids whose parts break the syntax; with --flips, docids that are not
    # the rendering of their own parts, and those equal to their flip); indexes built before them hold none
    docids_skipped: Count = 0
    flips_unsplit: Count = 0
    flips_symmetric: Count = 0


class IndexRecord(msgspec.Struct):
    format: Literal["grtool-index/1"]
    kind: Literal["fm", "trie", "numpy"]
    tokenizer: TokenizerInfo
    sizes: Sizes
    files: dict[FileName, FileEntry]
    source: Literal["docids", "documents"] = "docids"  # indexes built before --source documents hold none
    params: Params = msgspec.field(default_factory=Params)
    grtool_version: str = "?"
    command: list[str] | str = msgspec.field(default_factory=list)
    created: str = ""
    build_seconds: Seconds = 0.0
    build: dict[str, Annotated[float, msgspec.Meta(ge=0.0, le=1e15)]] = msgspec.field(default_factory=dict)
    inputs: list[dict[str, Any]] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        s, p = self.sizes, self.params
        if not self.files:
            raise ValueError("files: lists no files")
        for name in ("max_sequence_tokens", "collisions", "flipped_sequences"):
            limit = s.tokens if name == "max_sequence_tokens" else s.sequences
            if getattr(s, name) > limit:
                raise ValueError(f"sizes.{name}: {getattr(s, name)} is more than the {limit} {'tokens' if name == 'max_sequence_tokens' else 'sequences'}")
        if s.sequences and s.max_sequence_tokens * s.sequences < s.tokens:
            raise ValueError(f"sizes.max_sequence_tokens: {s.tokens} tokens in {s.sequences} sequences cannot all be at most {s.max_sequence_tokens} long")
        if self.source == "docids" and s.tokens < 2 * s.sequences:
            raise ValueError(f"sizes.tokens: {s.tokens} tokens cannot hold {s.sequences} docids (two markers each)")
        if s.flipped_sequences and not p.flips:
            raise ValueError("sizes.flipped_sequences: flipped sequences in an index built without --flips (params.flips false)")
        if p.flips and self.source != "docids":
            raise ValueError("params.flips: flips are docids' tail-first spellings; the source is documents")
        if self.kind == "fm":
            missing = [f for f in ("n", "levels", "sample_rate", "dollar_row") if getattr(p, f) is None]
            if missing:
                raise ValueError(f"params.{missing[0]}: an FM-index records n, levels, sample_rate and dollar_row")
            if p.n != s.tokens + s.sequences:
                raise ValueError(f"params.n: {p.n} symbols, not sizes.tokens ({s.tokens}) plus one separator per sequence (sizes.sequences: {s.sequences})")
            # The builder sorts n + 1 rows: row 0 is the empty suffix (after the unique smallest sentinel), so the
            # whole text's row, where the sentinel stands in the BWT, is one of rows 1..n (n when the whole text is
            # the largest suffix: one docid, or a last docid whose reversed tokens sort last). The native reader
            # checks that this row holds the whole text's sample.
            if not 1 <= p.dollar_row <= p.n:  # type: ignore[operator]
                raise ValueError(f"params.dollar_row: {p.dollar_row} is not a row of the whole text (1 to n {p.n})")


def read_index_record(index_dir: Path) -> IndexRecord:
    """index.json of ``index_dir`` through its declaration; :class:`DamagedRecord` naming the field otherwise."""
    return read_record(index_dir / META, IndexRecord, what="index record")


def _refuse(index_dir: Path, field: str, why: str) -> DamagedRecord:
    return DamagedRecord(f"{index_dir / META}: field {field}: {why} (edited or damaged); {REBUILD}")


def confirm_files(index_dir: Path, record: IndexRecord) -> None:
    """What the files listed say about the record: the kind's search files, the source's docid table and the
    flips' flags are there exactly when the record says so (a record naming another kind or source would be read
    as that kind, or queried as that source: no answer, or another one)."""
    names = set(record.files)
    missing = [f for f in COMMON_FILES if f not in names]
    if missing:
        raise _refuse(index_dir, "files", f"lists no {missing[0]}, a file every index holds")
    prefix = KIND_PREFIXES[record.kind]
    other = sorted(n for n in names if n.startswith(SEARCH_PREFIXES) and not n.startswith(prefix))
    if other or not any(n.startswith(prefix) for n in names):
        found = other[0] if other else "none"
        raise _refuse(index_dir, "kind", f"{record.kind!r}, but the files listed are not that kind's ({prefix}* files; found {found})")
    if record.source == "documents" and DOCID_TABLE in names:
        raise _refuse(index_dir, "source", f"'documents', but the index holds a {DOCID_TABLE} (an index of docids)")
    if record.params.flips != (FLIPS_FILE in names):
        raise _refuse(index_dir, "params.flips", f"{str(record.params.flips).lower()}, but the index {'holds no' if record.params.flips else 'holds a'} {FLIPS_FILE}")
    lines = record.files["doc_ids.txt"].bytes
    if record.sizes.documents is not None and (record.sizes.documents > lines or (record.sizes.documents == 0) != (lines == 0)):
        raise _refuse(index_dir, "sizes.documents", f"{record.sizes.documents} documents cannot be the {lines:,} bytes of doc_ids.txt")


class _AddedToken(msgspec.Struct):
    id: int
    content: str


class _TokenizerFile(msgspec.Struct):
    added_tokens: list[_AddedToken] = msgspec.field(default_factory=list)


def marker_ids_in_file(tokenizer_json: Path) -> dict[str, int] | None:
    """The docid markers' ids as tokenizer.json adds them (grtool adds them as special tokens), read without
    building the tokenizer; None when the file does not add them (a vocabulary that has them already)."""
    from grtool.docid import DOCID_END, DOCID_START

    try:
        added = msgspec.json.decode(tokenizer_json.read_bytes(), type=_TokenizerFile).added_tokens
    except (OSError, msgspec.DecodeError):
        return None  # the tokenizer itself is read (and a bad one refused) by whoever loads it
    ids = {t.content: t.id for t in added if t.content in (DOCID_START, DOCID_END)}
    return ids if len(ids) == 2 else None


def confirm_source(index_dir: Path, record: IndexRecord, index: Any) -> None:
    """A docids index holds docids: every sequence starts with <docid_start> (one anchored step counts them).
    An index of documents read as docids would answer every docid query with nothing."""
    n = record.sizes.sequences
    if record.source == "docids" and n:
        starting = index.count(index.extend(index.start(), record.tokenizer.docid_start_id))
        if starting != n:
            raise _refuse(index_dir, "source", f"'docids', but {n - starting:,} of its {n:,} sequences do not start with the docid marker (an index of documents?)")


def confirm_markers(index_dir: Path, record: IndexRecord, load_tokenizer: Any) -> None:
    """The marker ids the record names are its tokenizer's marker tokens: a docid query is anchored at them,
    so other ids would answer "no documents". ``load_tokenizer``: the index's own (loaded only when the file does
    not add the markers itself)."""
    from grtool.docid import DOCID_END, DOCID_START

    ids = marker_ids_in_file(index_dir / TOKENIZER)
    if ids is None:
        tok = load_tokenizer()
        ids = {DOCID_START: tok.start_id, DOCID_END: tok.end_id}
    t = record.tokenizer
    for field, marker, recorded in (("docid_start_id", DOCID_START, t.docid_start_id), ("docid_end_id", DOCID_END, t.docid_end_id)):
        if ids[marker] != recorded:
            raise _refuse(index_dir, f"tokenizer.{field}", f"{recorded}, but {TOKENIZER} has {marker} as id {ids[marker]}")


def confirm_totals(index_dir: Path, record: IndexRecord) -> None:
    """The byte totals agree with the files listed (checked after each file's own size, so an edited size names
    its file)."""
    s = record.sizes
    total = sum(f.bytes for f in record.files.values())
    if s.total_bytes is not None and s.total_bytes != total:
        raise _refuse(index_dir, "sizes.total_bytes", f"{s.total_bytes:,}, the files listed hold {total:,} bytes")
    search = sum(f.bytes for n, f in record.files.items() if n.startswith(SEARCH_PREFIXES))
    if s.index_bytes and s.index_bytes != search:
        raise _refuse(index_dir, "sizes.index_bytes", f"{s.index_bytes:,}, the search files listed hold {search:,} bytes")


def confirm_sizes(index_dir: Path, record: IndexRecord, lengths: Any) -> None:
    """The sizes the record gives are those of seq_lengths.npy (a length bound read from the record, such as
    ``max_sequence_tokens``, limits what a retrieval may generate)."""
    import numpy as np

    s = record.sizes
    tokens = int(np.sum(lengths, dtype=np.uint64))
    longest = int(lengths.max()) if len(lengths) else 0
    checks = (("sizes.sequences", s.sequences, len(lengths)), ("sizes.tokens", s.tokens, tokens), ("sizes.max_sequence_tokens", s.max_sequence_tokens, longest))
    for field, recorded, found in checks:
        if recorded != found:
            raise _refuse(index_dir, field, f"{recorded:,}, but seq_lengths.npy gives {found:,}")
