"""Document identity: a stable content hash of the normalized title and text.

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
    return " ".join(unicodedata.normalize("NFC", s).split())


def doc_id(title: str, text: str) -> str:
    key = normalize(title) + "\n" + normalize(text)
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16).hexdigest()
