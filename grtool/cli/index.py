"""`grtool index` commands."""

from __future__ import annotations

from enum import Enum
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, TableInput, register
from grtool.cli.options import Json, Overwrite, out_path, print_report

register(Group("index", "Build and query the docid index for constrained decoding."))


class Kind(str, Enum):  # grtool.index.kinds.KINDS
    fm = "fm"
    trie = "trie"
    numpy = "numpy"


class Source(str, Enum):  # grtool.index.build.SOURCES
    docids = "docids"
    documents = "documents"


# Not the stages' --out: an index is a directory of files, never JSON Lines on stdout.
IndexOut = Annotated[Path, typer.Option("--out", "-o", parser=out_path, metavar="DIR", help="Index directory to write ('-' is refused: an index is a directory of files).")]


def build_cmd(
    triples: Annotated[str, typer.Argument(help="Triples stage directory (or run directory); with --source documents, the documents stage.")],
    tokenizer: Annotated[
        str,
        typer.Option(
            "--tokenizer",
            "-t",
            help="The tokenizer of the model that will decode, spelled as its --model: a local model or checkpoint directory, a .gguf file, a HF hub id in the local cache, SmolLM2-135M-Instruct (= default, the embedded model); or a tokenizer.json, or a built-in: llama3, qwen.",
        ),
    ],
    out: IndexOut,
    kind: Annotated[Kind, typer.Option("--kind", help="fm (native FM-index), trie (prefix tree) or numpy (reference oracle).")] = Kind.fm,
    source: Annotated[Source, typer.Option("--source", help="docids: the distinct docid strings; documents: whole texts (substring decoding).")] = Source.docids,
    sample_rate: Annotated[Optional[int], typer.Option("--sample-rate", min=1, help="FM-index: keep every Nth suffix position for locate (default 32).")] = None,
    flips: Annotated[bool, typer.Option("--flips", help="Also index each docid tail-first (tail, relation, head), as the chains teach, mapping to the same documents.")] = False,
    memory_limit: Annotated[
        Optional[str],
        typer.Option(
            "--memory-limit", help="FM-index: size the build's suffix-sorting buckets to stay under this (8G, 512M); refused up front when the text alone (about 2.2 bytes a token) does not fit."
        ),
    ] = None,
    overwrite: Overwrite = False,
    as_json: Json = False,
) -> None:
    """Tokenize every docid whole (markers as special tokens) and build an index directory.

    The directory carries the exact tokenizer.json it used and index.json (command, version, fingerprints,
    sizes, checksums). Run again with the same input, tokenizer and options, it says "up to date" and keeps the
    index (exit 0, nothing read or tokenized); with another input or option it exits 2 naming what differs,
    and --overwrite rebuilds.

    Example: grtool index build out/run/triples --tokenizer llama3 --out out/run/index
    """
    from grtool.index.build import build_index, stats
    from grtool.index.base import Index
    from grtool.log import stage_summary

    meta = build_index(triples, out, tokenizer=tokenizer, kind=kind.value, source=source.value, sample_rate=sample_rate, overwrite=overwrite,
                       flips=flips, memory_limit=memory_limit)  # fmt: skip
    up_to_date = bool(meta.get("up_to_date"))
    report = {**stats(Index.open(out)), "up_to_date": up_to_date}
    if as_json:
        print_report(report)
    else:
        flipped = f", {report['flipped_sequences']:,} of them flipped ({report['flips_token_share']:.1%} of the tokens)" if flips else ""
        state = "up to date (same input, tokenizer and options), kept" if up_to_date else "built"
        stage_summary.print(
            f"[green]index[/] {out}: {state}: {report['kind']}, {report['sequences']:,} sequences{flipped}, {report['tokens']:,} tokens, "
            f"{report['bits_per_token']} bits/token, built in {report['build_seconds']} s"
        )


def _build_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The embedded model's tokenizer, or one read from a .gguf file, comes with the llm extra."""
    from grtool.models import DEFAULT_MODEL_NAME

    tokenizer = str(options.get("tokenizer") or "")
    needs_llm = tokenizer in ("default", DEFAULT_MODEL_NAME) or tokenizer.endswith(".gguf")
    return [("llm", f"--tokenizer {tokenizer}")] if needs_llm else []


register(Command("index build", build_cmd, reads={"triples": PathKind.STAGE}, writes={"out": PathKind.DIRECTORY}, extras=_build_extras, report="grtool.index.build:IndexReport"))


def query_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    text: Annotated[Optional[str], typer.Argument(help="A whole docid 'head, relation, tail' (its documents) or, when the index holds no such docid, a docid prefix (the valid next tokens).")] = None,
    prefix: Annotated[bool, typer.Option("--prefix", help="Read TEXT as a docid prefix even when it is a whole docid.")] = False,
    ids: Annotated[Optional[str], typer.Option("--ids", help="The prefix as comma-separated token ids instead of text.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows to show in the table (JSON always has all).")] = 30,
    corpus: Annotated[Optional[Path], typer.Option("--corpus", help="Corpus whose titles name the documents (default: the one behind the index's triples, when recorded).")] = None,
    as_json: Json = False,
) -> None:
    """The documents of a whole docid (with their titles), or the valid next tokens after a docid prefix, with counts.

    TEXT is read as a whole docid first (spaces around it and markers typed with it do not matter); when the
    index holds no such docid, or with --prefix, it is a prefix anchored at <docid_start>. The output says
    which reading was used (read_as in --json: docid, prefix or ids).

    Example: grtool index query out/run/index "Theodor Dräger, place of birth, Lübeck" --json
    """
    from grtool.errors import InputError
    from grtool.index.base import Index
    from grtool.index.build import dump_json
    from grtool.index.query import IDS, WHOLE_DOCID, parse_ids, prefix_ids, query, query_text

    if text is not None and ids is not None:
        raise InputError("give the prefix as TEXT or as --ids, not both")
    if prefix and text is None:
        raise InputError("--prefix reads TEXT as a prefix: give TEXT (token ids given with --ids are always a prefix)")
    parsed = parse_ids(ids) if ids is not None else None
    idx = Index.open(index)
    if text is not None:
        result = query_text(idx, text, prefix=prefix)
    else:
        result = {**query(idx, prefix_ids(idx, None, parsed)), "read_as": IDS}
    titles = _titles(index, corpus, result["docs"])
    if as_json:
        typer.echo(dump_json({**result, "titles": titles}))
        return
    from rich.table import Table

    from grtool.log import console

    named = ", ".join(f"{titles[d]} ({d})" if d in titles else d for d in result["docs"])

    what = f"prefix {result['text']!r}" if "text" in result else f"prefix ids {result['prefix_ids']}"
    if result["read_as"] == WHOLE_DOCID:
        flipped = " (a flipped docid: tail, relation, head)" if result["flipped"] else ""
        found = f"documents: {named}{flipped}" if result["docs"] else "not a docid of this index"
        console.print(f"whole docid {result['text']!r}: {found}", highlight=False)
        return
    console.print(f"{what}: {result['count']:,} matches, {len(result['next']):,} next tokens", highlight=False)
    table = Table()
    for col in ("id", "text", "count"):
        table.add_column(col, justify="right" if col != "text" else "left")
    for row in result["next"][:limit]:
        table.add_row(str(row["id"]), repr(row["text"]), f"{row['count']:,}")
    console.print(table)
    if result["docs"]:
        console.print(f"documents: {named}" + (" (a flipped docid: tail, relation, head)" if result["flipped"] else ""), highlight=False)


register(Command("index query", query_cmd, reads={"index": PathKind.DIRECTORY, "corpus": PathKind.STAGE}))


def _titles(index: Path, corpus: Path | None, doc_ids: list[str]) -> dict[str, str]:
    """Titles of the documents a query found: from --corpus, else the corpus behind the index's triples ({} when
    none is recorded, e.g. an index built from JSON Lines on stdin)."""
    from grtool.inspect.rows import titles_of
    from grtool.inspect.sources import documents_of

    if not doc_ids:
        return {}
    documents = documents_of(index, corpus)
    return titles_of(documents, set(doc_ids)) if documents is not None else {}


def stats_cmd(
    index: Annotated[Path, typer.Argument(help="Index directory.")],
    corpus: Annotated[
        Optional[Path], typer.Option("--corpus", help="Also the gold coverage of this corpus (run directory or questions stage): the share of its gold documents with a docid in the index.")
    ] = None,
    as_json: Json = False,
) -> None:
    """Tokens, sequences, documents, bytes, bits per token and build parameters of an index.

    With --corpus, also the gold coverage per dataset and split: the corpus's gold documents that hold at least one
    docid in the index, and the questions none of whose gold documents does (recall 0 by construction);
    `coverage` in --json. Below 100% a warning says what to do.

    Example: grtool index stats out/run/index --corpus out/run/corpus --json
    """
    from grtool.evaluation.gold_coverage import coverage_table, coverage_warning, gold_coverage
    from grtool.index.base import Index
    from grtool.index.build import stats
    from grtool.log import log

    opened = Index.open(index)
    report = stats(opened)
    coverage = gold_coverage(corpus, opened) if corpus is not None else None
    if coverage is not None and (warning := coverage_warning(coverage)):
        log.warning("%s", warning)
    if as_json:
        print_report(report if coverage is None else {**report, "coverage": coverage})
        return
    from rich.table import Table

    from grtool.log import console, lines

    from rich.markup import escape

    from grtool.cli.shape import pretty_value

    table = Table(show_header=False, title=escape(str(index)))
    table.add_column(no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in report.items():
        table.add_row(key, lines(pretty_value(" ".join(value) if key == "command" and isinstance(value, list) else value).split("\n")))
    console.print(table)
    if coverage is not None:
        console.print(coverage_table(coverage))


register(Command("index stats", stats_cmd, reads={"index": PathKind.DIRECTORY, "corpus": TableInput("questions")}, report="grtool.index.build:IndexReport"))
