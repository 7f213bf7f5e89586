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
    <kind files>        fm_*.npy | trie_*.marisa | oracle_*.npy
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from grtool.errors import InputError

META = "index.json"
TOKENIZER = "tokenizer.json"
FORMAT = "grtool-index/1"


def load_array(path: Path, mmap: bool = True) -> np.ndarray:
    """A flat array file, memory-mapped (read-only) so opening a large index costs no copy."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"{path.parent}: index file {path.name} is missing") from None


class Index:
    """The query API every kind implements; open any index directory with :meth:`Index.open`.

    A *state* is an opaque value: ``start()`` is the empty prefix at a sequence start, ``extend(state, t)``
    appends token ``t``. ``next_tokens(state)`` gives ``(ids, counts)`` ascending by id, ``count(state)`` the
    number of occurrences, ``locate(state, limit)`` an ``(m, 2)`` array of (sequence, offset) rows sorted.
    """

    kind = "?"

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = path
        self.meta = meta

    @staticmethod
    def open(path: str | Path) -> "Index":
        p = Path(path)
        if not (p / META).is_file():
            raise InputError(f"{p}: not an index directory (no {META}); build one with `grtool index build`")
        try:
            meta = json.loads((p / META).read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{p / META}: not valid JSON ({e})") from None
        if meta.get("format") != FORMAT:
            raise InputError(f"{p / META}: unknown index format {meta.get('format')!r} (expected {FORMAT})")
        from grtool.index import kinds

        cls = kinds.KINDS.get(meta.get("kind"))
        if cls is None:
            raise InputError(f"{p / META}: unknown index kind {meta.get('kind')!r}")
        return cls.load(p, meta)

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
        return self.meta.get("source", "docids")

    @cached_property
    def tokenizer(self):
        from grtool.index.tokenizer import from_json_file

        return from_json_file(self.path / TOKENIZER)

    @property
    def start_id(self) -> int:
        return int(self.meta["tokenizer"]["docid_start_id"])

    @property
    def end_id(self) -> int:
        return int(self.meta["tokenizer"]["docid_end_id"])

    @cached_property
    def seq_lengths(self) -> np.ndarray:
        return load_array(self.path / "seq_lengths.npy")

    @cached_property
    def _seq_docs(self) -> tuple[np.ndarray, np.ndarray]:
        return load_array(self.path / "seq_docs_offsets.npy"), load_array(self.path / "seq_docs.npy")

    @cached_property
    def doc_ids(self) -> list[str]:
        return (self.path / "doc_ids.txt").read_text().split("\n")[:-1]

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
        return load_array(self.path / "seq_flipped.npy") if (self.path / "seq_flipped.npy").is_file() else None

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
