"""The one triples → documents lookup: docid keys (:func:`grtool.docid.normalize`) to the stored triple and
the documents holding it, as written or read tail-first. Used by the filters and by eval recall / KTO.

Strings are never kept: a key is a 64-bit polars hash. Two sorted arrays answer a whole batch of keys with
``searchsorted``:

- forward: the key of each stored triple (8 bytes) and its document (4 bytes: a row of the document table);
  a triple held by several documents (a collision) has one entry per document;
- flipped: the key of each triple read ``tail, relation, head`` (8 bytes) and the row of its forward key
  (4 bytes).

So **≈ 24 bytes per triple**, plus per document 8 bytes of hash, 8 of offset and its id. The arrays live in
files built once per triples stage and memory-mapped by every later run (:mod:`grtool.docid.lookup_files`): a
process holds only the pages its lookups touch. A key found both forward and flipped is the forward triple
(its own spelling is the more likely meaning); a key that is the flip of several triples picks one of them
(the same in every run).

A false hit needs two different keys with equal 64-bit hashes; for 10^8 triples that is about one chance
in 10^11 per docid looked up.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

from grtool.docid import Markers, normalize_expr

HASH_SEED = 0x6772746F6F6C  # any fixed seed; the files are keyed by the polars version and a probe hash (lookup_files)


def hash_keys(keys: Sequence[str] | pa.Array | pl.Series) -> np.ndarray:
    """64-bit hashes of keys (or of any strings: document ids); nulls hash to a fixed value no key is stored under.
    One call per batch: a call costs ~0.1 ms whatever its size."""
    series = keys if isinstance(keys, pl.Series) else pl.from_arrow(keys) if isinstance(keys, pa.Array) else pl.Series(list(keys), dtype=pl.String)
    return series.cast(pl.String).hash(HASH_SEED).to_numpy()


def use_trimmable_arrow_pool() -> None:
    """Send this process's later Arrow allocations to the system allocator. Arrow's default pool (mimalloc)
    keeps freed pages in per-thread heaps that ``release_unused`` does not return; glibc's are handed back by
    :func:`release_build_memory` (malloc_trim). Measured: no slower for grtool's reads, ~50-100 MB less held
    (retrieve's checks at 1M triples; index build's read at 1M)."""
    pa.set_memory_pool(pa.system_memory_pool())


def release_build_memory() -> None:
    """Hand a build's freed scratch memory back to the OS: Arrow's pool and glibc keep freed pages unless
    asked (a marisa trie builds from a key set several times its size; the lookup from shard arrays)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, found among the symbols the process already has (None: not glibc). Not through
    ctypes.util.find_library: that runs ldconfig in a child process, a fork of a build holding hundreds of MB,
    at every call."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


def docid_hashes(docids: pa.Array | pl.Series, markers: Markers) -> np.ndarray:
    """Hashes of the keys of whole docid strings (markers included, as in the chains' docids column); a
    string not wrapped in ``markers`` gets the hash of null, under which no triple is stored."""
    series = docids if isinstance(docids, pl.Series) else pl.from_arrow(docids)
    s = pl.col("d").cast(pl.String)
    inner = s.str.slice(len(markers.start), s.str.len_chars() - len(markers.start) - len(markers.end))
    wrapped = s.str.starts_with(markers.start) & s.str.ends_with(markers.end) & (s.str.len_chars() >= len(markers.start) + len(markers.end))
    frame = pl.DataFrame({"d": series}).select(pl.when(wrapped).then(normalize_expr(inner)).hash(HASH_SEED))
    return frame.to_series().to_numpy()


@dataclass
class Resolved:
    """Per looked-up key: the stored triple (its forward key's hash, 0 when unknown), the documents holding it
    (rows of the document table) and whether it was found only tail-first."""

    triple: list[int]
    docs: list[tuple[int, ...]]
    flipped: list[bool]


def _sort_pairs(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The order that sorts rows by (key, value). One argsort of the keys, then a lexsort of the few rows
    whose key repeats (collisions, repeated triples): several times faster than a lexsort of everything."""
    order = np.argsort(keys)
    k = keys[order]
    repeated = np.zeros(len(k), bool)
    if len(k) > 1:
        same = k[1:] == k[:-1]
        repeated[1:] |= same
        repeated[:-1] |= same
    at = np.flatnonzero(repeated)  # whole runs of equal keys, in key order
    if len(at):
        sub = order[at]
        order[at] = sub[np.lexsort((values[sub], keys[sub]))]
    return order


def _dedupe(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows sorted by (key, value) without repeats, and for every input row its row in the result."""
    order = _sort_pairs(keys, values)
    k, v = keys[order], values[order]
    keep = np.ones(len(order), bool)
    if len(order):
        keep[1:] = (k[1:] != k[:-1]) | (v[1:] != v[:-1])
    row_of = np.empty(len(order), np.int64)
    row_of[order] = np.cumsum(keep) - 1
    return k[keep], v[keep], row_of


class TripleLookup:
    def __init__(
        self,
        fkeys: np.ndarray,
        fdocs: np.ndarray,
        bkeys: np.ndarray,
        bfwd: np.ndarray,
        doc_hashes: np.ndarray,
        doc_text: bytes | np.ndarray,
        doc_offsets: np.ndarray,
        count: int,
        path: Path | None = None,
    ):
        self.fkeys, self.fdocs = fkeys, fdocs  # sorted forward keys; per key the document's row
        self.bkeys, self.bfwd = bkeys, bfwd  # sorted flipped keys; per key the row of the triple's forward key
        self.doc_hashes = doc_hashes  # the document table: hashes of the document ids (sorted)
        self.doc_text, self.doc_offsets = doc_text, doc_offsets  # the document ids, row for row (UTF-8, concatenated)
        self.count = count  # triple rows read
        self.path = path  # the directory of the files (None: in memory)

    def resolve(self, hashes: np.ndarray, *, rows: bool = False) -> Resolved:
        """Stored triple, documents and flipped flag of each key hash; an unknown key gets triple 0 and no
        documents. Documents are their hashes (as :func:`hash_keys` gives them), or with ``rows`` their rows of
        the document table (see :meth:`doc_ids_of`)."""
        hashes = np.asarray(hashes, np.uint64)
        lo, hi = _ranges(self.fkeys, hashes)
        triple = hashes.copy()
        flipped = hi == lo
        if flipped.any() and len(self.bkeys):
            at = np.flatnonzero(flipped)
            blo, bhi = _ranges(self.bkeys, hashes[at])
            found = bhi > blo
            row = self.bfwd[np.minimum(blo, len(self.bkeys) - 1)].astype(np.int64)  # first row of the forward key
            fwd = self.fkeys[row]
            lo[at] = np.where(found, row, lo[at])
            hi[at] = np.where(found, _run_end(self.fkeys, row, fwd), lo[at])
            triple[at] = np.where(found, fwd, 0)
            flipped[at] = found
        else:
            triple[flipped] = 0
            flipped[:] = False
        first = self.fdocs[np.minimum(lo, len(self.fdocs) - 1)] if len(self.fdocs) else np.zeros(len(lo), np.uint32)
        single = (first if rows else self.doc_hashes[first]).tolist()
        docs: list[tuple[int, ...]] = []
        for i, n in enumerate((hi - lo).tolist()):
            if n == 0:
                docs.append(())
            elif n == 1:
                docs.append((single[i],))
            else:  # a collision: several documents hold the triple
                span = self.fdocs[lo[i] : hi[i]]
                docs.append(tuple((span if rows else self.doc_hashes[span]).tolist()))
        return Resolved(triple.tolist(), docs, flipped.tolist())

    def doc_ids_of(self, rows: tuple[int, ...]) -> frozenset[str]:
        """The document ids of rows of the document table."""
        off = self.doc_offsets
        return frozenset(bytes(self.doc_text[int(off[i]) : int(off[i + 1])]).decode() for i in rows)


def _index_type(n: int) -> type:
    return np.uint32 if n < 2**32 else np.uint64


def _ranges(keys: np.ndarray, needles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, end) rows of each needle in the sorted keys (first == end: absent). Sorted needles walk the
    (large) key array in order, with far fewer cache misses than random probes; the end is searched only
    for the few keys held by several rows."""
    if not len(keys):
        return np.zeros(len(needles), np.int64), np.zeros(len(needles), np.int64)
    order = np.argsort(needles, kind="stable")
    lo = np.empty(len(needles), np.int64)
    lo[order] = np.searchsorted(keys, needles[order], "left")
    found = keys[np.minimum(lo, len(keys) - 1)] == needles
    return lo, np.where(found, _run_end(keys, lo, needles), lo)


def _run_end(keys: np.ndarray, first: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The row after the run of ``values`` that starts at ``first`` (runs longer than one row are rare)."""
    end = first + 1
    longer = np.flatnonzero((end < len(keys)) & (keys[np.minimum(end, len(keys) - 1)] == values))
    if len(longer):
        end[longer] = np.searchsorted(keys, values[longer], "right")
    return end
