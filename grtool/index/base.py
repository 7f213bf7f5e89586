"""What every index kind shares: the directory layout, the metadata, the docid → documents map.

An index holds k token *sequences* (the distinct docids, or whole documents) and answers, for a prefix
anchored at a sequence start, which tokens may come next. Sequence i maps to one or more documents
(docid collisions map to every document).

Directory layout::

    index.json          metadata: command, version, kind, tokenizer and input fingerprints, sizes, checksums
    tokenizer.json      the exact tokenizer the sequences were tokenized with (markers included)
    doc_ids.txt         document ids, one per line
    seq_docs_offsets.npy, seq_docs.npy   CSR map sequence -> document indices
    seq_lengths.npy     tokens per sequence
    docids.parquet      the docid strings in sequence order (``--source docids`` only; with flips a ``flipped`` column)
    seq_flipped.npy     uint8 per sequence: 1 for a tail-first spelling (only in an index built with ``--flips``)
    docid_bytes.bin, docid_bytes_offsets.npy, docid_bytes_keys.npy, docid_bytes.json
                        the docid texts sorted bytewise, for bracket decoding (:mod:`grtool.index.docid_bytes`;
                        written by the build, or on first use for an index built before them)
    <kind files>        fm_*.npy | trie_*.marisa | oracle_*.npy
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from grtool.errors import InputError
from grtool.index.record import (
    FORMAT, META, REBUILD, TOKENIZER, IndexRecord, confirm_files, confirm_markers, confirm_sizes, confirm_source, confirm_totals, read_index_record,
)  # fmt: skip
from grtool.log import log

__all__ = ["FORMAT", "META", "REBUILD", "TOKENIZER", "Index", "IndexRecord"]


def damaged(index_dir: Path, name: str, what: str) -> InputError:
    """The one-line error of a damaged index file."""
    return InputError(f"index {index_dir}: {name}: {what} (damaged); {REBUILD}")


def load_array(path: Path, mmap: bool = True, dtype: Any = None, ndim: int = 1) -> np.ndarray:
    """A flat array file, memory-mapped (read-only) so opening a large index costs no copy. With ``dtype``
    the array must be exactly that (the native code reads it in place): C order, ``ndim`` dimensions."""
    try:
        arr = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path.parent}: index file {path.name} is missing") from None
    except Exception as e:  # a bad header (numpy parses it: ValueError, SyntaxError, TokenError ...), a truncated or empty file
        raise damaged(path.parent, path.name, f"not a readable array ({e})") from None
    if dtype is not None and (arr.dtype != np.dtype(dtype) or arr.ndim != ndim or not arr.flags.c_contiguous):
        raise damaged(path.parent, path.name, f"holds {arr.dtype.str} {arr.shape}, expected {np.dtype(dtype).str} with {ndim} dimension(s)")
    return arr


_WARNED_UNVERIFIED: set[str] = set()


def verify_files(index_dir: Path, record: IndexRecord) -> None:
    """Every file index.json lists exists with its recorded size and (indexes built since blake3 digests are
    recorded) content. The digests are computed once per process for an unchanged file (grtool.store.stage
    file_hash: memory-mapped, multithreaded BLAKE3); older indexes get their sizes checked and one warning.
    The names and sizes are the declaration's (plain file names, counts): nothing outside the index is read."""
    from grtool.store.fingerprints import file_hash

    unverified = False
    for name, rec in record.files.items():
        try:
            size = (index_dir / name).stat().st_size
        except FileNotFoundError:
            raise damaged(index_dir, name, "missing") from None
        if size != rec.bytes:
            raise damaged(index_dir, name, f"{size:,} bytes, index.json records {rec.bytes}")
        if rec.blake3 is None:
            unverified = True
        elif file_hash(index_dir / name) != rec.blake3:
            raise damaged(index_dir, name, "content does not match index.json")
    if unverified and str(index_dir) not in _WARNED_UNVERIFIED:
        _WARNED_UNVERIFIED.add(str(index_dir))
        log.warning("index %s: built before grtool recorded content digests: sizes checked, content not verified (rebuild to verify it)", index_dir)


# Each kind's class (grtool.index.kinds) registers itself here by its ``kind`` name as it is defined, so opening
# an index needs no import of the kinds from this module (the package imports them: grtool/index/__init__.py).
KINDS: dict[str, type["Index"]] = {}


class Index:
    """The query API every kind implements; open any index directory with :meth:`Index.open`.

    A *state* is an opaque value: ``start()`` is the empty prefix at a sequence start, ``extend(state, t)``
    appends token ``t``. ``next_tokens(state)`` gives ``(ids, counts)`` ascending by id, ``count(state)`` the
    number of occurrences, ``locate(state, limit)`` an ``(m, 2)`` array of (sequence, offset) rows sorted.
    """

    kind = "?"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        KINDS[cls.kind] = cls

    def __init__(self, path: Path, meta: dict[str, Any], record: IndexRecord | None = None):
        self.path = path
        self.meta = meta
        self.record = record  # the typed index.json (None for an in-memory index)

    @staticmethod
    def open(path: str | Path) -> "Index":
        p = Path(path)
        if not (p / META).exists():
            raise InputError(f"{p}: not an index directory (no {META}); build one with `grtool index build`")
        record = read_index_record(p)
        confirm_files(p, record)
        cls = KINDS[record.kind]
        verify_files(p, record)
        confirm_totals(p, record)
        confirm_sizes(p, record, load_array(p / "seq_lengths.npy", dtype=np.uint32))  # before the kind reads the sizes
        index = cls.load(p, msgspec.to_builtins(record))  # Index.meta: the JSON form, as an in-memory index holds it
        index.record = record
        # tokenizer.json is now verified against its digest: the marker ids the record names must be its markers
        confirm_markers(p, record, lambda: index.tokenizer)
        confirm_source(p, record, index)
        return index

    # ---- the search API (each kind overrides these)
    def start(self) -> Any:
        raise NotImplementedError

    def extend(self, state: Any, token_id: int) -> Any:
        raise NotImplementedError

    def next_tokens(self, state: Any) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def count(self, state: Any) -> int:
        raise NotImplementedError

    def locate(self, state: Any, limit: int) -> np.ndarray:
        raise NotImplementedError

    # ---- shared
    def walk(self, ids: list[int]) -> Any:
        state = self.start()
        for t in ids:
            state = self.extend(state, int(t))
        return state

    @property
    def source(self) -> str:
        return self.record.source if self.record is not None else self.meta.get("source", "docids")

    @cached_property
    def tokenizer(self):
        from grtool.index.tokenizer import from_json_file

        return from_json_file(self.path / TOKENIZER)

    @property
    def start_id(self) -> int:
        return self.record.tokenizer.docid_start_id if self.record is not None else int(self.meta["tokenizer"]["docid_start_id"])

    @property
    def end_id(self) -> int:
        return self.record.tokenizer.docid_end_id if self.record is not None else int(self.meta["tokenizer"]["docid_end_id"])

    @property
    def num_sequences(self) -> int | None:
        return self.meta.get("sizes", {}).get("sequences")

    def _per_sequence(self, name: str, dtype: Any) -> np.ndarray:
        arr = load_array(self.path / name, dtype=dtype)
        if self.num_sequences is not None and len(arr) != self.num_sequences:
            raise damaged(self.path, name, f"{len(arr):,} entries for {self.num_sequences:,} sequences")
        return arr

    @cached_property
    def seq_lengths(self) -> np.ndarray:
        return self._per_sequence("seq_lengths.npy", np.uint32)

    @cached_property
    def _seq_docs(self) -> tuple[np.ndarray, np.ndarray]:
        """The CSR map sequence -> documents, checked once (offsets ascend within seq_docs, documents exist)."""
        offsets = load_array(self.path / "seq_docs_offsets.npy", dtype=np.int64)
        docs = load_array(self.path / "seq_docs.npy", dtype=np.uint32)
        k = self.num_sequences if self.num_sequences is not None else len(offsets) - 1
        if len(offsets) != k + 1 or offsets[0] != 0 or offsets[-1] != len(docs) or (np.diff(offsets) < 0).any():
            raise damaged(self.path, "seq_docs_offsets.npy", f"not {k + 1:,} ascending offsets into seq_docs.npy")
        if len(docs) and int(docs.max()) >= len(self.doc_ids):
            raise damaged(self.path, "seq_docs.npy", f"a document index beyond the {len(self.doc_ids):,} documents")
        return offsets, docs

    @cached_property
    def doc_ids(self) -> "DocIds":
        return DocIds(self.path / "doc_ids.txt")

    def held_doc_ids(self):
        """The documents at least one sequence maps to (a docid of theirs is in the index), as an Arrow string
        array: what decoding can retrieve (:mod:`grtool.evaluation.gold_coverage` counts the gold ones)."""
        import pyarrow as pa

        _, docs = self._seq_docs
        return self.doc_ids.arrow().take(pa.array(np.unique(docs)))

    def docs_of_sequence(self, seq: int) -> list[str]:
        offsets, docs = self._seq_docs
        return [self.doc_ids[d] for d in docs[offsets[seq] : offsets[seq + 1]]]

    def sequences_of(self, ids: list[int]) -> list[int]:
        """Sequences that are exactly ``ids`` (a complete docid, markers included)."""
        state = self.walk(ids)
        n = self.count(state)
        if n == 0:
            return []
        hits = self.locate(state, n)
        lengths = self.seq_lengths
        return [int(s) for s, off in hits if off == 0 and int(lengths[s]) == len(ids)]

    def _whole(self, docid_ids: list[int]) -> list[int]:
        ids = [int(t) for t in docid_ids]
        if self.source == "docids" and ids and ids[0] != self.start_id:
            ids = [self.start_id, *ids, self.end_id]  # accept a docid given without its markers
        return ids

    def docs_of(self, docid_ids: list[int]) -> list[str]:
        """Documents a complete docid maps to (empty if it is not in the index), sorted."""
        return sorted({d for s in self.sequences_of(self._whole(docid_ids)) for d in self.docs_of_sequence(s)})

    # ---- flips (an index built with --flips also holds every docid's tail-first spelling)
    @property
    def flips(self) -> bool:
        return bool(self.meta.get("params", {}).get("flips", False))

    @cached_property
    def _seq_flipped(self) -> np.ndarray | None:
        return self._per_sequence("seq_flipped.npy", np.uint8) if (self.path / "seq_flipped.npy").is_file() else None

    def is_flipped(self, seq: int) -> bool:
        """Whether sequence ``seq`` is a flipped (tail-first) spelling; False in an index without flips."""
        flags = self._seq_flipped
        return bool(flags[seq]) if flags is not None else False

    def resolve_docid(self, docid_ids: list[int]) -> tuple[list[str], bool | None]:
        """(documents, flipped) of a complete docid (markers optional): flipped is None when the docid is not
        in the index, else whether it is only a tail-first spelling (a symmetric triple's flip that equals a
        forward docid is that forward docid: False)."""
        seqs = self.sequences_of(self._whole(docid_ids))
        if not seqs:
            return [], None
        docs = sorted({d for s in seqs for d in self.docs_of_sequence(s)})
        return docs, all(self.is_flipped(s) for s in seqs)

    def docid_flipped(self, docid_ids: list[int]) -> bool | None:
        """None when ``docid_ids`` is not a complete docid of the index, else whether it is a flipped spelling."""
        return self.resolve_docid(docid_ids)[1]


class DocIds(Sequence[str]):
    """doc_ids.txt, memory-mapped: line ``i`` is read (and decoded) when asked, so a process holds 8 bytes per
    document (where each line starts), not a Python string per document."""

    _CHUNK = 1 << 24  # bytes scanned for newlines at a time

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise InputError(f"{path.parent}: index file {path.name} is missing") from None
        if size:
            with open(path, "rb") as f:
                self._text = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            data = np.frombuffer(self._text, np.uint8)
            ends = [np.flatnonzero(data[at : at + self._CHUNK] == 10) + at for at in range(0, size, self._CHUNK)]
            self._ends = np.concatenate(ends)
        else:
            self._text, self._ends = b"", np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self._ends)

    def arrow(self):
        """Every line as one Arrow string array over the mapped bytes (no Python string per document)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        offsets = np.concatenate([np.zeros(1, np.int64), self._ends.astype(np.int64) + 1])  # each line with its newline
        lines = pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(offsets), pa.py_buffer(self._text))
        try:
            lines.validate(full=True)
        except pa.ArrowInvalid:
            raise damaged(self.path.parent, self.path.name, "a line is not UTF-8 text") from None
        return pc.utf8_slice_codeunits(lines, 0, -1)  # without the newline

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        end = int(self._ends[i])  # IndexError past the end, as a list
        start = int(self._ends[i - 1]) + 1 if (i % len(self)) else 0
        try:
            return self._text[start:end].decode()
        except UnicodeDecodeError:
            raise damaged(self.path.parent, self.path.name, f"line {i % len(self) + 1} is not UTF-8 text") from None
