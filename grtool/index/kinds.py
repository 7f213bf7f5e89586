"""The three index kinds over the same sequences: native FM-index, prefix tree, and the numpy oracle.

Each kind has ``write(dir, flat, lengths, **params) -> meta`` (flat = all sequences' token ids
concatenated, lengths = tokens per sequence) and ``load(dir, meta)``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from grtool.errors import GrtoolError, InputError
from grtool.index.base import KINDS, META, REBUILD, Index, damaged, load_array  # noqa: F401  (KINDS: filled by the classes below)
from grtool.errors import printable
from grtool.store.locks import pid_alive

DEFAULT_SAMPLE_RATE = 32


def separator_positions(lengths: np.ndarray, dtype: Any = np.uint64) -> np.ndarray:
    """Where each sequence's separator sits in T = 0 s1 0 s2 ... 0 sk (the FM-index keeps them as uint32: T < 2^31)."""
    seps = np.zeros(len(lengths), dtype=dtype)
    if len(lengths) > 1:
        np.cumsum(np.asarray(lengths[:-1], dtype=dtype) + 1, out=seps[1:], dtype=dtype)
    return seps


# ------------------------------------------------------------------------------------------------ FM


def _native():
    try:
        from grtool.index import _fm
    except ImportError as e:  # the extension is built by `pip install` (setup.py)
        raise GrtoolError(f"the native FM-index extension is not built ({e}); reinstall grtool with `pip install -e .`") from None
    return _fm


WIDE_MIN_ROWS = 1024  # the native next_tokens memoizes ranges at least this wide; the build persists the widest
WIDE_TOKENS_PER_ENTRY = 128  # persisted next-token entries: one full list (sigma) plus one per 128 tokens
CACHE_FILES = ("cache_ranges", "cache_offsets", "cache_ids", "cache_counts")  # the persisted wide ranges' next tokens
FM_DTYPES = {
    "levels": np.uint64, "levels_idx": np.uint64, "level_sizes": np.uint64, "zeros": np.uint64, "offsets": np.int64, "marks": np.uint64,
    "marks_idx": np.uint64, "samples": np.uint32, "seps": np.uint32, "tok2sym": np.int32, "sym2tok": np.uint32, "codes": np.uint32,
    "code_lens": np.uint8, "tree": np.int32, "cache_ranges": np.uint64, "cache_offsets": np.uint64, "cache_ids": np.uint32, "cache_counts": np.uint64,
}  # fmt: skip  # what each file holds: the native code reads them in place


def _consumable_file(arr: np.ndarray) -> str:
    """The file a read-only memory map ``arr`` is, whole and from its start ("" otherwise): the native build may
    give its disk back as it reads it."""
    if not (isinstance(arr, np.memmap) and arr.mode == "r" and arr.offset == 0 and arr.filename):
        return ""
    try:
        whole = os.path.getsize(arr.filename) == arr.nbytes
    except OSError:
        return ""
    return str(arr.filename) if whole else ""


def _read_only_map(arr: np.ndarray) -> bool:
    """Whether an array is a view of a read-only numpy memory map (file-backed pages it may give back)."""
    base = arr
    while base is not None and not (isinstance(base, np.memmap) and getattr(base, "_mmap", None) is not None):
        base = getattr(base, "base", None)
    return base is not None and base.mode == "r"


def parse_bytes(text: str | int) -> int:
    """``2G``, ``512M``, ``1.5GB`` or a number of bytes."""
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().removesuffix("B")
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):  # OverflowError: inf, which float() reads but no int holds
        raise GrtoolError(f"--memory-limit {text!r}: expected a size like 8G or 512M") from None


SORT_ITEM_BYTES = 16  # one suffix while its bucket is sorted (native/build.hpp)
MIN_SORT_ITEMS = 1 << 16
SORT_SHARE = 128  # by default a bucket holds about 1/128 of the suffixes: 0.125 bytes a symbol


def fm_fixed_bytes(tokens: int, sequences: int, sigma: int) -> int:
    """What an FM build holds in memory besides one sorting bucket: the text at log2(sigma) bits a symbol, a
    rank per sequence (two while they are computed) and a separator position, the sampled rows, the per-symbol tables, then the index."""
    n = tokens + sequences
    text = n * max(1, int(sigma).bit_length()) // 8
    return text + 12 * sequences + n // 4 + 64 * sigma + (8 << 20)


def fm_sort_items(tokens: int, sequences: int, sigma: int, memory_limit: str | int | None) -> int:
    """How many suffixes one sorting bucket may hold: the default share, or what keeps this process under
    ``memory_limit`` (what it holds already, the build's fixed part, the bucket); refused when even the
    smallest bucket would not fit."""
    n = tokens + sequences
    default = max(MIN_SORT_ITEMS, n // SORT_SHARE)
    if memory_limit is None:
        return default
    import psutil

    limit, held, fixed = parse_bytes(memory_limit), psutil.Process().memory_info().rss, fm_fixed_bytes(tokens, sequences, sigma)
    fit = (limit - held - fixed) // SORT_ITEM_BYTES
    if fit < MIN_SORT_ITEMS:
        need = held + fixed + MIN_SORT_ITEMS * SORT_ITEM_BYTES
        raise GrtoolError(
            f"building this FM-index takes about {need / 2**20:,.0f} MiB in this process ({held / 2**20:,.0f} MiB held already, the "
            f"text at {max(1, int(sigma).bit_length())} bits a symbol, a rank per sequence, the sampled rows), more than "
            f"--memory-limit {memory_limit}: raise the limit or split the corpus"
        )
    return int(min(fit, max(default, n // 4)))


SCRATCH_BYTES = "scratch_bytes"  # what a kind's write() reports besides its parameters: its peak of scratch disk
SCRATCH_PREFIX = ".fm-build-"  # + the building process's pid + "-": a later build removes those of dead processes


def remove_stale_scratch(where: Path) -> None:
    """Scratch directories of FM builds whose process is gone (killed: SIGKILL, a crash, a power cut)."""
    try:
        entries = list(where.glob(f"{SCRATCH_PREFIX}*-*"))
    except OSError:
        return
    for d in entries:
        pid = d.name[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)) and d.is_dir() and d.stat().st_uid == os.getuid():
            shutil.rmtree(d, ignore_errors=True)


def run_cancellable(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a native build step on a worker thread (it releases the GIL), so this thread stays free to take
    SIGINT/SIGTERM: their exception here sets the native cancel flag, the step stops within a fraction of a
    second (its scratch files removed as it unwinds), and the exception goes on."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)  # signals only reach the main thread
    _fm = _native()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # handed to the waiting thread
            result["error"] = e

    worker = threading.Thread(target=work, name="fm-build", daemon=True)
    _fm.set_cancel(False)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
    except BaseException:
        _fm.set_cancel(True)
        worker.join()
        _fm.set_cancel(False)
        raise
    if "error" in result:
        raise result["error"]
    return result["value"]


def build_fm_arrays(
    flat: np.ndarray,
    lengths: np.ndarray,
    sample_rate: int = DEFAULT_SAMPLE_RATE,
    memory_limit: str | int | None = None,
    scratch_dir: Path | None = None,
    sort_items: int | None = None,
    consume: bool = False,
) -> dict[str, Any]:
    """The FM-index arrays over T = 0 s1 0 s2 ... 0 sk (see native/fm_index.cpp for the layout, native/build.hpp
    for the construction). The suffixes are sorted in buckets through scratch files in ``scratch_dir`` (the
    system's temporary directory by default); ``memory_limit`` sizes the buckets (``sort_items`` sets them:
    tests make them tiny to exercise the splits). ``consume``: ``flat`` maps a scratch file of the caller's
    whose disk the build gives back as it reads it (its ids read as zeros afterwards; ``scratch_bytes``, the
    build's peak of scratch disk, counts what is left of it)."""
    import tempfile

    _fm = _native()
    release = _consumable_file(flat) if consume else ""
    flat = np.ascontiguousarray(flat)  # once: the native passes need contiguous ids (a copy only if they are not)
    lengths = np.ascontiguousarray(lengths)
    if lengths.dtype not in (np.int64, np.uint32, np.int32):
        lengths = lengths.astype(np.int64)
    if len(lengths) == 0:
        raise GrtoolError("no sequences to index")
    # A read-only memory map of the token ids gives its pages back as the native code reads them (file-backed:
    # they stay in the page cache; holding them would count against the build's peak). Asked of the contiguous
    # array: a copy is the process's own memory, whose pages must not be dropped.
    drop = _read_only_map(flat)
    try:
        tok2sym, sym2tok = _fm.dense_alphabet(flat, drop)
    except ValueError as e:
        raise GrtoolError(str(e)) from None
    sigma = len(sym2tok)
    n = int(flat.size + len(lengths))
    if n >= (1 << 31) - 1:
        raise GrtoolError(f"{n:,} tokens: the FM-index holds up to 2^31 - 1 tokens and separators; split the corpus")
    max_items = sort_items or fm_sort_items(int(flat.size), len(lengths), sigma, memory_limit)
    where = Path(scratch_dir) if scratch_dir is not None else Path(tempfile.gettempdir())
    remove_stale_scratch(where)
    with tempfile.TemporaryDirectory(dir=where, prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        try:
            built = run_cancellable(_fm.build_fm, flat, lengths, tok2sym, sigma, sample_rate, max_items, f"{scratch}/bwt", drop, release)
        except ValueError as e:  # the native checks of the input
            raise GrtoolError(str(e)) from None
    levels, levels_idx, level_sizes, zeros, marks, marks_idx, samples, dollar_row, counts, codes, code_lens, tree, scratch_bytes = built
    first_row = 1 + np.concatenate([[0], np.cumsum(counts)[:-1]])  # C[c]: row 0 is the empty suffix
    L = len(level_sizes)
    arrays = {
        "levels": levels, "levels_idx": levels_idx, "level_sizes": level_sizes, "zeros": zeros,
        "offsets": np.zeros(sigma, np.int64), "marks": marks, "marks_idx": marks_idx, "samples": samples,
        "seps": separator_positions(lengths, np.uint32), "tok2sym": tok2sym, "sym2tok": sym2tok, "codes": codes, "code_lens": code_lens,
        "tree": tree,
    }  # fmt: skip
    probe = _fm.FMIndex(**arrays, n=n, L=L, sample_rate=sample_rate, dollar_row=dollar_row)
    arrays["offsets"] = (first_row - probe.symbol_starts(sigma).astype(np.int64)).astype(np.int64)
    # The next tokens of the widest ranges (the first tokens after <docid_start> list tens of thousands) are
    # computed here once and persisted, so a decoder's first visit of them is a copy, not a traversal.
    full = _fm.FMIndex(**arrays, n=n, L=L, sample_rate=sample_rate, dollar_row=dollar_row)
    ranges, offsets, ids, next_counts = run_cancellable(full.wide_ranges, WIDE_MIN_ROWS, sigma + n // WIDE_TOKENS_PER_ENTRY)
    arrays.update(cache_ranges=ranges, cache_offsets=offsets, cache_ids=ids, cache_counts=next_counts)
    return {"arrays": arrays, "n": n, "L": L, "sample_rate": sample_rate, "sigma": sigma, "dollar_row": dollar_row, "scratch_bytes": scratch_bytes}


class FMIndex(Index):
    """The native FM-index; its hot methods are the C++ methods themselves (no Python wrapper per call)."""

    kind = "fm"
    FILES = (
        "levels", "levels_idx", "level_sizes", "zeros", "offsets", "marks", "marks_idx", "samples", "seps", "tok2sym", "sym2tok",
        "codes", "code_lens", "tree",
    )  # fmt: skip

    def __init__(self, path: Path, meta: dict[str, Any], native):
        super().__init__(path, meta)
        self.native = native
        self.extend = native.extend
        self.next_tokens = native.next_tokens
        self.count = native.count
        self.locate = native.locate

    def start(self, anchored: bool = True):
        """The prefix at a sequence start; ``anchored=False``: any position (substring search)."""
        return self.native.start(anchored)

    @staticmethod
    def _native_index(arrays: dict[str, Any], n: int, L: int, sample_rate: int, dollar_row: int):
        native = _native().FMIndex(**{k: v for k, v in arrays.items() if k not in CACHE_FILES}, n=n, L=L, sample_rate=sample_rate, dollar_row=dollar_row)
        if all(arrays.get(k) is not None for k in CACHE_FILES):
            native.set_persisted(*(np.ascontiguousarray(arrays[k]).reshape(-1) for k in CACHE_FILES))
        return native

    @staticmethod
    def write(out: Path, flat: np.ndarray, lengths: np.ndarray, sample_rate: int = DEFAULT_SAMPLE_RATE, memory_limit: str | int | None = None, consume: bool = False, **_: Any) -> dict[str, Any]:
        built = build_fm_arrays(flat, lengths, sample_rate, memory_limit, scratch_dir=out, consume=consume)
        for name, arr in built["arrays"].items():
            np.save(out / f"fm_{name}.npy", arr)
        params = {"n": built["n"], "levels": built["L"], "sample_rate": sample_rate, "sigma": built["sigma"], "dollar_row": built["dollar_row"]}
        return {**params, SCRATCH_BYTES: built["scratch_bytes"]}

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> "FMIndex":
        if not (path / "fm_tree.npy").is_file():
            raise InputError(f"{path}: an FM-index from an older grtool (before its Huffman-shaped levels); rebuild it with `grtool index build`")
        names = [*cls.FILES, *(name for name in CACHE_FILES if (path / f"fm_{name}.npy").is_file())]
        # persisted wide ranges (indexes built before them have none: answers are computed on first visit)
        arrays = {name: load_array(path / f"fm_{name}.npy", dtype=FM_DTYPES[name], ndim=2 if name in ("tree", "cache_ranges") else 1) for name in names}
        k = meta.get("sizes", {}).get("sequences")
        if k is not None and len(arrays["seps"]) != k:  # locate's sequence numbers index the per-sequence files
            raise damaged(path, "fm_seps.npy", f"{len(arrays['seps']):,} separators for {k:,} sequences")
        try:
            p = meta["params"]
            n, levels, sample_rate, dollar_row = int(p["n"]), int(p["levels"]), int(p["sample_rate"]), int(p["dollar_row"])
        except (KeyError, TypeError, ValueError):
            raise damaged(path, META, "no FM-index parameters (n, levels, sample_rate, dollar_row)") from None
        try:
            # the native constructor checks the arrays' shapes and the values it follows (the code tree, symbols,
            # persisted offsets); every query checks each offset it reads against its array (a DamagedIndex)
            native = cls._native_index(arrays, n, levels, sample_rate, dollar_row)
            native.set_label(printable(path))  # its messages name the index; a name that is not UTF-8 too
        except (ValueError, TypeError) as e:
            raise InputError(f"index {printable(path)}: {e} (damaged); {REBUILD}") from None
        return cls(path, meta, native)

    @classmethod
    def from_sequences(cls, flat: np.ndarray, lengths: np.ndarray, sample_rate: int = DEFAULT_SAMPLE_RATE, sort_items: int | None = None) -> "FMIndex":
        """An in-memory index (tests, benchmarks); no directory, no document map."""
        built = build_fm_arrays(flat, lengths, sample_rate, sort_items=sort_items)
        native = cls._native_index(built["arrays"], built["n"], built["L"], sample_rate, built["dollar_row"])
        return cls(Path("<memory>"), {"params": {}}, native)


# ---------------------------------------------------------------------------------------------- trie

_END = -1  # marks "a sequence ends here" among a prefix's continuations


def _char(token: int) -> str:
    # One code point per token id, skipping the surrogate range that str cannot carry through UTF-8.
    c = token + 0x100
    return chr(c + 0x800 if c >= 0xD800 else c)


def _key(tokens) -> str:
    return "^" + "".join(map(_char, tokens))


class TrieIndex(Index):
    """GRLS-style prefix tree over the distinct sequences, with each prefix's continuations precomputed.

    ``trie_next.marisa`` maps every prefix to packed uint32 ``[count, k, ids(k), counts(k)]``;
    ``trie_keys.marisa`` holds the complete sequences, for locate. States are prefix keys (``None`` = dead).
    Only prefixes anchored at a sequence start exist here.
    """

    kind = "trie"

    def __init__(self, path: Path, meta: dict[str, Any], nxt, keys, key_offsets: np.ndarray, key_seqs: np.ndarray):
        super().__init__(path, meta)
        self._next = nxt
        self._keys = keys
        self._key_offsets = key_offsets
        self._key_seqs = key_seqs

    def start(self):
        return "^"

    def extend(self, state, token_id: int):
        if state is None:
            return None
        key = state + _char(int(token_id))
        return key if key in self._next else None

    def _value(self, state) -> np.ndarray | None:
        if state is None:
            return None
        got = self._next.get(state)
        return np.frombuffer(got[0], dtype=np.uint32) if got else None

    def next_tokens(self, state):
        v = self._value(state)
        if v is None:
            return np.zeros(0, np.uint32), np.zeros(0, np.uint64)
        k = int(v[1])
        return v[2 : 2 + k].copy(), v[2 + k : 2 + 2 * k].astype(np.uint64)

    def count(self, state) -> int:
        v = self._value(state)
        return 0 if v is None else int(v[0])

    def locate(self, state, limit: int) -> np.ndarray:
        hits: list[int] = []
        if state is not None:
            for _key_text, key_id in self._keys.iteritems(state):
                hits.extend(int(s) for s in self._key_seqs[self._key_offsets[key_id] : self._key_offsets[key_id + 1]])
                if len(hits) >= limit:
                    break
        hits = sorted(hits[:limit])
        out = np.zeros((len(hits), 2), dtype=np.int64)
        out[:, 0] = hits
        return out

    @staticmethod
    def write(out: Path, flat: np.ndarray, lengths: np.ndarray, **_: Any) -> dict[str, Any]:
        import marisa_trie

        ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
        keys_of_seq = [_key(flat[e - n : e].tolist()) for e, n in zip(ends, lengths)]
        follow: dict[str, Counter] = defaultdict(Counter)
        for key in keys_of_seq:
            follow[key][_END] += 1
            for i in range(1, len(key)):
                follow[key[:i]][ord(key[i])] += 1
        items = []
        for prefix, counter in follow.items():
            total = sum(counter.values())
            nxt = sorted((_token_of(c), n) for c, n in counter.items() if c != _END)
            ids = [t for t, _ in nxt]
            cnt = [n for _, n in nxt]
            items.append((prefix, np.array([total, len(ids), *ids, *cnt], dtype=np.uint32).tobytes()))
        marisa_trie.BytesTrie(items).save(str(out / "trie_next.marisa"))
        keys = marisa_trie.Trie(keys_of_seq)
        keys.save(str(out / "trie_keys.marisa"))
        by_key: dict[int, list[int]] = defaultdict(list)
        for seq, key in enumerate(keys_of_seq):
            by_key[keys[key]].append(seq)
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        flat_seqs: list[int] = []
        for key_id in range(len(keys)):
            flat_seqs.extend(by_key[key_id])
            offsets[key_id + 1] = len(flat_seqs)
        np.save(out / "trie_key_offsets.npy", offsets)
        np.save(out / "trie_key_seqs.npy", np.array(flat_seqs, dtype=np.uint32))
        return {"prefixes": len(items)}

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> "TrieIndex":
        import marisa_trie

        nxt, keys = marisa_trie.BytesTrie(), marisa_trie.Trie()
        nxt.mmap(str(path / "trie_next.marisa"))
        keys.mmap(str(path / "trie_keys.marisa"))
        return cls(path, meta, nxt, keys, load_array(path / "trie_key_offsets.npy", dtype=np.int64), load_array(path / "trie_key_seqs.npy", dtype=np.uint32))

    @classmethod
    def from_sequences(cls, flat: np.ndarray, lengths: np.ndarray, workdir: Path) -> "TrieIndex":
        workdir.mkdir(parents=True, exist_ok=True)
        cls.write(workdir, np.asarray(flat), np.asarray(lengths))
        return cls.load(workdir, {"params": {}})


def _token_of(code: int) -> int:
    c = code - 0x800 if code >= 0xD800 + 0x800 else code
    return c - 0x100


# -------------------------------------------------------------------------------------------- oracle


class NumpyIndex(Index):
    """The test oracle: the plain token text and brute-force scans. Obviously right, slow on big corpora.

    T holds token ids with -1 at the separators; a state is (start positions of the matches, length).
    """

    kind = "numpy"

    def __init__(self, path: Path, meta: dict[str, Any], text: np.ndarray, seps: np.ndarray):
        super().__init__(path, meta)
        self.text = np.asarray(text, dtype=np.int64)
        self.seps = np.asarray(seps, dtype=np.int64)

    def start(self, anchored: bool = True):
        if anchored:
            return self.seps, 1
        return np.flatnonzero(self.text >= 0), 0

    def _following(self, state) -> tuple[np.ndarray, np.ndarray]:
        starts, m = state
        pos = starts + m
        ok = pos < len(self.text)
        return starts[ok], self.text[pos[ok]]

    def extend(self, state, token_id: int):
        starts, following = self._following(state)
        return starts[following == int(token_id)], state[1] + 1

    def next_tokens(self, state):
        _, following = self._following(state)
        ids, counts = np.unique(following[following >= 0], return_counts=True)
        return ids.astype(np.uint32), counts.astype(np.uint64)

    def count(self, state) -> int:
        return len(state[0])

    def locate(self, state, limit: int) -> np.ndarray:
        starts, m = state
        if m == 0:
            raise ValueError("locate needs a non-empty prefix")
        seq = np.searchsorted(self.seps, starts, side="right") - 1
        offset = np.maximum(starts - self.seps[seq] - 1, 0)
        out = np.stack([seq, offset], axis=1).astype(np.int64) if len(starts) else np.zeros((0, 2), np.int64)
        out = out[np.lexsort((out[:, 1], out[:, 0]))]
        return out[:limit]

    @staticmethod
    def text_of(flat: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        seps = separator_positions(lengths).astype(np.int64)
        text = np.full(len(flat) + len(lengths), -1, dtype=np.int64)
        mask = np.ones(len(text), bool)
        mask[seps] = False
        text[mask] = flat
        return text, seps

    @staticmethod
    def write(out: Path, flat: np.ndarray, lengths: np.ndarray, **_: Any) -> dict[str, Any]:
        text, seps = NumpyIndex.text_of(flat, lengths)
        np.save(out / "oracle_text.npy", text.astype(np.int32))
        np.save(out / "oracle_seps.npy", seps)
        return {}

    @classmethod
    def load(cls, path: Path, meta: dict[str, Any]) -> "NumpyIndex":
        return cls(path, meta, load_array(path / "oracle_text.npy", mmap=False, dtype=np.int32), load_array(path / "oracle_seps.npy", dtype=np.int64))

    @classmethod
    def from_sequences(cls, flat: np.ndarray, lengths: np.ndarray) -> "NumpyIndex":
        text, seps = cls.text_of(np.asarray(flat), np.asarray(lengths))
        return cls(Path("<memory>"), {"params": {}}, text, seps)
