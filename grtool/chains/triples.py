"""Reading a triples stage for chain prompts: the triples of given documents, and a pool of distractors."""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds

from grtool.chains.docids import Triple
from grtool.docid import triple_problem
from grtool.errors import InputError
from grtool.log import log
from grtool.store.reading import open_shard, read_row_group
from grtool.store.records import resolve_stage
from grtool.store.stage import shard_paths

COLUMNS = ["doc_id", "idx", "head", "relation", "tail"]


class TripleStore:
    """A triples stage directory opened for lookups by document (a filtered scan, never the whole table)."""

    def __init__(self, path: str | Path):
        if str(path) == "-":
            raise InputError("TRIPLES cannot be '-': chains look triples up by document, which needs a stage directory")
        self.path = resolve_stage(path, "triples")
        self.parts = shard_paths(self.path)
        self.dataset = ds.dataset([str(p) for p in self.parts], format="parquet") if self.parts else None
        self.skipped = 0  # triples never offered: parts the docid syntax rejects (stages from before the check)

    def _offerable(self, r: dict) -> bool:
        """A triple whose docid can be written and read back (grtool.docid.triple_problem); the index skips the
        others, so a chain citing one would teach a docid the model can never decode."""
        problem = triple_problem((r["head"], r["relation"], r["tail"]))
        if problem is None:
            return True
        if not self.skipped:
            log.warning("%s holds triples the docid syntax rejects, never offered to chains (the first: doc %s, %s: %s)",
                        self.path, r["doc_id"], problem.reason, problem.detail)  # fmt: skip
        self.skipped += 1
        return False

    def for_docs(self, doc_ids: Iterable[str]) -> dict[str, list[Triple]]:
        """Each document's triples in extraction order; documents without triples are absent."""
        wanted = sorted(set(doc_ids))
        out: dict[str, list[Triple]] = {}
        if self.dataset is None or not wanted:
            return out
        table = self.dataset.to_table(columns=COLUMNS, filter=pc.field("doc_id").isin(wanted))
        table = table.sort_by([("doc_id", "ascending"), ("idx", "ascending")])
        for r in table.to_pylist():
            if not self._offerable(r):
                continue
            out.setdefault(r["doc_id"], []).append(Triple(r["doc_id"], r["idx"], r["head"], r["relation"], r["tail"]))
        return out

    def distractor_pool(self, seed: int, size: int = 20_000, groups: int = 8) -> list[Triple]:
        """A seeded sample of triples from a few random row groups: cheap to read, fixed for a (stage, seed).

        Several row groups from different parts keep the pool from being one neighbourhood of documents.
        """
        rng = random.Random(f"distractors:{seed}")
        groups_all = [(p, g) for p in self.parts for g in range(open_shard(p).metadata.num_row_groups)]
        if not groups_all:
            return []
        chosen = rng.sample(groups_all, min(groups, len(groups_all)))
        per_group = max(1, size // len(chosen))
        pool: list[Triple] = []
        for part, group in sorted(chosen):
            rows = read_row_group(part, group, COLUMNS).to_pylist()
            for r in rng.sample(rows, min(per_group, len(rows))):
                if self._offerable(r):
                    pool.append(Triple(r["doc_id"], r["idx"], r["head"], r["relation"], r["tail"]))
        return pool
