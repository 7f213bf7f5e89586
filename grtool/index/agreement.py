"""Does a model's tokenizer agree with the tokenizer an index was built with?

Constrained decoding compares token ids: if the model splits a docid differently, or gives the docid markers
other ids, every index-valid token is a wrong one and decoding degrades silently. This check fails loudly
instead, naming the mismatch and the command that rebuilds the index with the model's tokenizer.

Two checks, both always: a sample of whole docids must tokenize to the same ids (it catches different merges and
normalisers, and its message shows a docid), and every token of the index's vocabulary must have the same id in
the model's (it catches what a sample misses: two tokens swapped anywhere in a vocabulary of 128K). Tokens only the
model has are harmless (the constraint never offers them inside a docid).
"""

from __future__ import annotations

import shlex

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from grtool.docid import DOCID_END, DOCID_START, SPECIAL
from grtool.errors import InputError
from grtool.index.base import Index
from grtool.store.reading import arrow_source
from grtool.vocab.gmr import DONE

SHOWN_IDS = 16  # ids of a docid shown in the message


def fix_command(index: Index, model_name: str) -> str:
    """The `grtool index build` line that rebuilds ``index`` from its recorded input with the model's tokenizer."""
    meta = index.meta
    inputs = meta.get("inputs") or [{}]
    params = meta.get("params") or {}
    args = ["grtool", "index", "build", str(inputs[0].get("path") or "TRIPLES"), "--tokenizer", model_name, "--out", str(index.path)]
    if meta.get("kind", "fm") != "fm":
        args += ["--kind", meta["kind"]]
    if index.source != "docids":
        args += ["--source", index.source]
    if params.get("flips"):
        args.append("--flips")
    return shlex.join([*args, "--overwrite"])


def sample_documents(index: Index, samples: int) -> list[str]:
    """Texts of ``samples`` whole sequences of a ``--source documents`` index (it stores no texts): from first tokens
    spread over the index's, each walked along its first continuation to a sequence end, decoded; and ``DONE``."""
    starts, _ = index.next_tokens(index.start())
    picks = sorted(set(np.linspace(0, len(starts) - 1, num=min(samples, len(starts)), dtype=np.int64).tolist())) if len(starts) else []
    longest = int(index.meta.get("sizes", {}).get("max_sequence_tokens") or 1 << 16)
    texts = [DONE]  # retrieve --mode gmr's stop word
    for i in picks:
        ids, state = [int(starts[i])], index.extend(index.start(), int(starts[i]))
        while len(ids) < longest:
            nxt, counts = index.next_tokens(state)
            if not len(nxt) or index.count(state) > int(np.sum(counts)):  # a sequence ends here
                break
            ids.append(int(nxt[0]))
            state = index.extend(state, int(nxt[0]))
        texts.append(index.tokenizer.tokenizer.decode(ids, skip_special_tokens=False))
    return texts


def sample_docids(index: Index, samples: int) -> list[str]:
    """``samples`` docids spread evenly over docids.parquet (the same ones on every call); for an index of
    documents, sampled documents (:func:`sample_documents`)."""
    if index.source == "documents":
        return sample_documents(index, samples)
    path = index.path / "docids.parquet"
    if not path.is_file():
        raise InputError(f"{index.path}: no docids.parquet (an index of --source documents has no docids to check)")
    reader = pq.ParquetFile(arrow_source(path))  # a directory name that is not UTF-8 too
    n = reader.metadata.num_rows
    picks = sorted(set(np.linspace(0, n - 1, num=min(samples, n), dtype=np.int64).tolist())) if n else []
    # Row group by row group, only those holding a pick: never the whole column (millions of docids).
    ends = np.cumsum([reader.metadata.row_group(g).num_rows for g in range(reader.num_row_groups)])
    out: list[str] = []
    for g in sorted(set(np.searchsorted(ends, picks, "right").tolist())):
        start = int(ends[g - 1]) if g else 0
        column = reader.read_row_group(g, columns=["docid"]).column("docid")
        out.extend(column[i - start].as_py() for i in picks if start <= i < int(ends[g]))
    return out


def _ids(ids: list[int]) -> str:
    return str(ids) if len(ids) <= SHOWN_IDS else f"[{', '.join(map(str, ids[:SHOWN_IDS]))}, … {len(ids)} ids]"


def check_agreement(index: Index, model_tokenizer: Tokenizer, model_name: str, *, markers: str = "special", samples: int = 64) -> None:
    """Raise :class:`InputError` unless ``model_tokenizer`` (a ``tokenizers.Tokenizer``; transformers:
    ``tok.backend_tokenizer``) tokenizes the index's docids to the index's ids.

    ``markers="special"``: the model must have ``<docid_start>``/``<docid_end>`` with the index's ids, and a
    sample of whole docids (markers included) must give the same ids. ``"brackets"``: the model writes
    ``[h, r, t]``, so only the vocabulary must agree: the docid texts of the sample, without markers.
    """
    if markers not in ("special", "brackets"):
        raise InputError(f"markers must be 'special' or 'brackets', got {markers!r}")
    tok_meta = index.meta.get("tokenizer") or {}
    index_tok = index.tokenizer.tokenizer
    built = (
        f"the index {index.path} was built with tokenizer {tok_meta.get('spec')!r} "
        f"(vocab {index_tok.get_vocab_size(with_added_tokens=True)}, {DOCID_START}={index.start_id}, {DOCID_END}={index.end_id})"
    )
    model = f"model {model_name} (vocab {model_tokenizer.get_vocab_size(with_added_tokens=True)})"
    fix = f"rebuild the index with the model's tokenizer:\n{fix_command(index, model_name)}"
    if markers == "special":
        got = (model_tokenizer.token_to_id(DOCID_START), model_tokenizer.token_to_id(DOCID_END))
        if got == (None, None):
            # Rebuilding alone cannot help here: the model itself never writes the markers.
            message = (
                f"{model} has no {DOCID_START}/{DOCID_END} marker tokens, so it cannot write docids for this index "
                f"({built}). A model trained with `grtool train sft` has them; for an off-the-shelf model use --markers brackets"
            )
            differs = _first_mismatch(index, model_tokenizer, samples, whole=False)
            raise InputError(message + (f". Its vocabulary differs too: {differs}; {fix}" if differs else ""))
        if got != (index.start_id, index.end_id):
            shown = ", ".join(f"{m} {'no id' if g is None else g}" for m, g in zip((DOCID_START, DOCID_END), got))
            raise InputError(f"{built}, but {model} gives {shown}; {fix}")
    differs = _first_mismatch(index, model_tokenizer, samples, whole=markers == "special") or vocabulary_mismatch(
        index_tok, model_tokenizer, skip={DOCID_START, DOCID_END} if markers == "brackets" else set()
    )
    if differs:
        raise InputError(f"{built}, but {model} disagrees: {differs}; {fix}")


def vocabulary_mismatch(index_tok: Tokenizer, model_tokenizer: Tokenizer, skip: frozenset[str] | set[str] = frozenset(), names: tuple[str, str] = ("index's", "model's")) -> str | None:
    """The first token (by the index's id) of the index's vocabulary, added tokens included, that the model's gives
    another id or none; ``skip``: tokens the model need not have (the markers, when it writes brackets)."""
    model_vocab = model_tokenizer.get_vocab(with_added_tokens=True)
    for token, want in sorted(index_tok.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1]):
        have = model_vocab.get(token)
        if have != want and token not in skip:
            return f"token {token!r} has id {want} in the {names[0]} vocabulary but {'no id' if have is None else f'id {have}'} in the {names[1]}"
    return None


def _first_mismatch(index: Index, model_tokenizer: Tokenizer, samples: int, whole: bool) -> str | None:
    """The first sampled docid (whole, or its text without markers) the two tokenizers split differently."""
    index_tok = index.tokenizer.tokenizer
    for docid in sample_docids(index, samples):
        text = docid if whole else (SPECIAL.unwrap(docid) or docid)
        want = index_tok.encode(text, add_special_tokens=False).ids
        have = model_tokenizer.encode(text, add_special_tokens=False).ids
        if want != have:
            what = "document" if index.source == "documents" else "docid"
            return f"{what} {text[:200]!r} tokenizes to {_ids(want)} with the index's tokenizer vs {_ids(have)} with the model's"
    return None
