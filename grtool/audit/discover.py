"""What grtool wrote under a directory, found by its records alone (`grtool validate`, `grtool report` and `grtool status
RUN` start from it): stage directories, orphaned shards, indexes, lookups, exports, reports (plots, JSON files) and
pipeline records. No
Parquet library is loaded here: `status` reads only JSON records."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


from grtool.records import DamagedRecord, read_json_record
from grtool.store.layout import FILE_RECORD, SHARDS_DIR
from grtool.store.records import is_stage_dir

LOOKUP_RECORD = "lookup.json"  # grtool.docid.lookup_files.RECORD
INDEX_META = "index.json"  # grtool.index.base.META (the index package is imported only when an index is found)
SHARD_GLOB = "part-*.parquet"


@dataclass
class Found:
    """What :func:`discover` finds under a directory."""

    stages: list[Path] = field(default_factory=list)
    orphans: list[Path] = field(default_factory=list)  # shards without a manifest
    indexes: list[Path] = field(default_factory=list)
    sidecars: list[Path] = field(default_factory=list)  # <export>.grtool.json
    files: list[Path] = field(default_factory=list)  # reports, plots, JSON files, by their .NAME.grtool-file.json
    dataset_infos: list[Path] = field(default_factory=list)
    lookups: list[Path] = field(default_factory=list)  # triples lookup caches (lookup.json, grtool.docid.lookup_files)
    pipeline_runs: list[Path] = field(default_factory=list)  # directories with _pipeline/<stage>.json records
    checkpoints: list[Path] = field(default_factory=list)  # `train` outputs (grtool.json, or a run's grtool-run.json)

    def nothing(self) -> bool:
        """Nothing grtool wrote was found (validate and report fail on it: exit 1)."""
        return not any((self.stages, self.orphans, self.indexes, self.sidecars, self.files, self.dataset_infos, self.lookups, self.pipeline_runs, self.checkpoints))


def is_orphan_dir(path: Path) -> bool:
    """Shards (``part-*.parquet``, or completion records in ``_shards/``) but no ``_manifest.json``."""
    if is_stage_dir(path) or not path.is_dir():
        return False
    return any(path.glob(SHARD_GLOB)) or any((path / SHARDS_DIR).glob("part-*.json"))


def is_checkpoint_dir(path: Path) -> bool:
    """A `train` output: a finished checkpoint's ``grtool.json``, or the record a run writes when it starts."""
    from grtool.vocab.provenance import CHECKPOINT_RECORD, RUN_RECORD

    return (path / CHECKPOINT_RECORD).is_file() or (path / RUN_RECORD).is_file()


def is_index_dir(path: Path) -> bool:
    return (path / INDEX_META).is_file() and not is_stage_dir(path)


def discover(root: str | Path) -> Found:
    """Stage directories, orphaned shards, indexes and exports under ``root`` (``_*`` and ``.*`` folders below it,
    a stage's own bookkeeping, caches and temporary builds, are not searched). A stage or index directory given
    itself is the only thing found."""
    from grtool.vocab.provenance import CHECKPOINT_RECORD, DATASET_INFO, RUN_RECORD, is_sidecar

    root = Path(root)
    found = Found()
    if is_stage_dir(root):
        found.stages.append(root)
        return found
    if is_index_dir(root):
        found.indexes.append(root)
        return found
    if (root / LOOKUP_RECORD).is_file():
        found.lookups.append(root)
        return found
    if is_checkpoint_dir(root):
        found.checkpoints.append(root)
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if "_pipeline" in dirnames:  # its stage records are read back by status and pipeline run: checked here too
            found.pipeline_runs.append(d)
        dirnames[:] = sorted(n for n in dirnames if not n.startswith(("_", ".")))
        if is_stage_dir(d):
            found.stages.append(d)
        elif is_orphan_dir(d):
            found.orphans.append(d)
        elif INDEX_META in dirnames or (INDEX_META in filenames and _is_grtool_index(d / INDEX_META)):  # a folder in a record's place is damage to report
            found.indexes.append(d)
            dirnames[:] = []
            continue
        elif LOOKUP_RECORD in filenames:
            found.lookups.append(d)
            continue
        elif CHECKPOINT_RECORD in filenames or RUN_RECORD in filenames:
            found.checkpoints.append(d)
            dirnames[:] = []
            continue
        for name in sorted(filenames + dirnames):  # a sidecar's name on a directory: a damaged sidecar, not none
            if is_sidecar(name):
                found.sidecars.append(d / name)
            elif name.startswith(".") and name.endswith(FILE_RECORD) and len(name) > len(FILE_RECORD) + 1:
                found.files.append(d / name[1 : -len(FILE_RECORD)])
            elif name == DATASET_INFO:
                found.dataset_infos.append(d / name)
    return found


def _is_grtool_index(meta_path: Path) -> bool:
    """An index.json grtool wrote (or one too damaged to tell: better reported than skipped)."""
    try:  # bounded size and nesting, and no read of a FIFO or /dev/zero: discovery must not hang on a damaged record
        meta = read_json_record(meta_path, what="index record")
    except (OSError, DamagedRecord):
        return True
    return isinstance(meta, dict) and str(meta.get("format", "")).startswith("grtool-index")
