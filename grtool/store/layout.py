"""The names inside a stage directory (DESIGN §2), shared by the writer, the locks and the overwrite rule."""

from __future__ import annotations

import re

MANIFEST = "_manifest.json"
SHARDS_DIR = "_shards"
REJECTS_DIR = "_rejects"
LOCK = "_manifest.lock"
RUN_LOCK = "_run.lock"  # held by the run writing the directory: exclusively by a whole run, shared by array tasks
TASK_LOCK = "_run.task-{index:05d}-of-{count:05d}.lock"  # held exclusively by one array task
TMP_SUFFIX = ".tmp"
# The temporary files grtool writes in a stage directory, by folder ("" is the stage itself): a part, the record,
# a shard record, a rejects file, each with its writer's host or pid. Only these are a killed run's leftovers; a
# user's notes.tmp beside them is not grtool's to remove.
TMP_PATTERNS = {
    "": ("part-*.parquet.*.tmp", f"{MANIFEST}.*.tmp"),
    SHARDS_DIR: ("part-*.json.*.tmp",),
    REJECTS_DIR: ("part-*.jsonl.*.tmp",),
}
# A request cache kept inside a stage directory (chains) survives --overwrite: a parser or filter fix then
# re-parses the stored answers instead of generating them again.
LLM_CACHE = "_llm_cache"
FILE_RECORD = ".grtool-file.json"  # `.NAME.grtool-file.json` beside a report, plot or JSON file grtool wrote
# The tables a stage directory holds (their Arrow schemas: grtool.store.schemas); named here, without pyarrow, for
# the readers of manifests and shard records (`grtool status` reads nothing else). A command of another package
# declares its own table once (grtool.store.schemas.register_table), which names it here too.
TABLE_NAMES = ("documents", "questions", "triples", "llm_calls", "chains", "responses", "answers")
TABLE_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_REGISTERED_NAMES: set[str] = set()


def known_table(name: str) -> bool:
    """Whether a manifest may name ``name``: one of grtool's tables, or one a command declared."""
    return name in TABLE_NAMES or name in _REGISTERED_NAMES


def name_table(name: str) -> None:
    """Called by :func:`grtool.store.schemas.register_table` only."""
    if not re.match(TABLE_NAME_PATTERN, name):
        raise ValueError(f"table {name!r}: a table's name is lower-case letters, digits and _, at most 64 characters, starting with a letter")
    _REGISTERED_NAMES.add(name)


# Part names have five digits and are ordered as text; no stage plans more parts (a manifest saying so is damaged,
# and nothing loops up to an unchecked count).
MAX_PARTS = 100_000
PART_PATTERN = r"^part-[0-9]{5}$"


def part_name(index: int) -> str:
    return f"part-{index:05d}"
