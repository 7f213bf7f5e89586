"""Document identity (not a docid, see :mod:`grtool.docid`): a stable content hash of the normalized title and text.

``doc_id = blake2b-128 hex of  normalize(title) + "\\n" + normalize(text)``, where ``normalize`` is Unicode NFC
followed by collapsing every run of whitespace (``str.split``'s notion: spaces, tabs, newlines, NBSP, ...)
into one space and stripping both ends. The stored title and text stay exactly as the dataset writes them;
only the hash sees the normalized form, so the same paragraph copied into several questions or datasets
(with a different Unicode composition or an extra space) becomes one document.

The title is part of the key because the same text under two titles is two Wikipedia pages. A normalized
title never contains a newline, so the separator makes the key unambiguous.
"""

from __future__ import annotations

import hashlib
import unicodedata

DOC_ID_SCHEME = "blake2b-128(nfc+ws(title) \\n nfc+ws(text))"


def normalize(s: str) -> str:
    if _plain(s):  # the common case, about ten times cheaper than splitting: already normalized
        return s
    return " ".join(unicodedata.normalize("NFC", s).split())


def _plain(s: str) -> bool:
    """ASCII (hence NFC) with no whitespace but single spaces inside: normalization would not change it."""
    return (
        s.isascii()
        and "  " not in s
        and "\n" not in s
        and "\t" not in s
        and "\r" not in s
        and "\x0b" not in s
        and "\x0c" not in s
        and "\x1c" not in s
        and "\x1d" not in s
        and "\x1e" not in s
        and "\x1f" not in s
        and s[:1] != " "
        and s[-1:] != " "
    )


def doc_id(title: str, text: str) -> str:
    key = normalize(title) + "\n" + normalize(text)
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()
