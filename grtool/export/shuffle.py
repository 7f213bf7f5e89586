"""A seeded shuffle in bounded memory: rows spill to bucket files by the top bits of a 64-bit key and come
back in key order, one bucket in memory at a time.

The key is a hash of (seed, row identity), so the order is a deterministic function of the seed and the
rows, whatever order they arrive in. Reading in key order also makes "the first N of each dataset" a random
sample of N, which is how per-dataset caps are applied without a second pass.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BUCKET_BITS = 8  # 256 bucket files: a few hundred MB of rows per bucket still needs ~100M rows in total


def shuffle_key(seed: int, *identity: object) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(str(seed).encode())
    for part in identity:
        h.update(b"\x00" + str(part).encode())
    return int.from_bytes(h.digest(), "big")


def unit_hash(text: str) -> float:
    """A stable number in [0, 1) for a string (used to split train/dev by qid, independent of the seed)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


class KeyedSpill:
    """Collect ``(key, tag, payload)`` on disk (a tag holds no tab); iterate ``(tag, payload)`` back sorted by key.

    A spilled line is ``<key as 16 hex digits>\\t<tag>\\t<payload>``: fixed-width keys sort as bytes, and the
    payload (already-encoded JSON, which never holds a raw tab or newline) is written out again untouched.
    """

    def __init__(self, directory: str | Path | None = None):
        self._tmp = tempfile.TemporaryDirectory(prefix="grtool-shuffle-", dir=directory)
        self._root = Path(self._tmp.name)
        self._files: dict[int, Any] = {}
        self.items = 0

    def add(self, key: int, tag: str, payload: bytes) -> None:
        bucket = key >> (64 - BUCKET_BITS)
        handle = self._files.get(bucket)
        if handle is None:
            handle = self._files[bucket] = open(self._root / f"{bucket:03d}.spill", "wb")
        handle.write(b"%016x\t%s\t%s\n" % (key, tag.encode(), payload))
        self.items += 1

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        for handle in self._files.values():
            handle.close()
        for bucket in sorted(self._files):
            with open(self._root / f"{bucket:03d}.spill", "rb") as f:
                lines = f.read().splitlines()
            lines.sort()
            for line in lines:
                _key, tag, payload = line.split(b"\t", 2)
                yield tag.decode(), payload

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._tmp.cleanup()

    def __enter__(self) -> "KeyedSpill":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
