"""Every place outside grtool/store/ that creates, replaces or deletes a file or directory, read from the code.

An output is claimed in ``grtool.store.outputs`` (``claim`` for stage, index, checkpoint and export outputs,
``grtool.store.partloop.claim_file`` for reports, plots and JSON files); what is left elsewhere writes *inside* what a claim handed out
(a stage's parts, an index being built, a trainer saving into its checkpoint) or into grtool's own scratch and
caches. Each module that does is listed here with why; a new one fails this test until it writes through a claim
or is added with its reason.
"""

from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "grtool"

# Method names that write, whatever object they are called on (a Path, a library's writer).
WRITING_METHODS = {
    "unlink",
    "rmdir",
    "mkdir",
    "write_text",
    "write_bytes",
    "touch",
    "symlink_to",
    "hardlink_to",
    "savefig",
    "write_parquet",
    "sink_parquet",
    "write_csv",
    "write_ndjson",
    "save_pretrained",
    "save_model",
}  # fmt: skip  (a stage's shard.write_table goes through grtool.store's writer)
# Functions that write, called by their module's name or imported alone.
WRITING_FUNCTIONS = {
    "os.replace", "os.rename", "os.remove", "os.unlink", "os.makedirs", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
    "shutil.rmtree", "shutil.move", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree",
    "atomic_write_bytes", "commit_file", "ParquetWriter", "pq.ParquetWriter", "pq.write_table",
}  # fmt: skip

ALLOWED = {
    "grtool/corpus/dedup_spill.py": "the dedup spill: scratch files in a temporary folder of its own, removed when done",
    "grtool/corpus/generic.py": "ingest's pending-rows scratch file inside the stage's work folder",
    "grtool/corpus/ingest.py": "ingest's work folder inside the claimed run directory, removed when the stages are in place",
    "grtool/corpus/synthetic.py": "makes the synthetic example datasets (a generator for tests and benchmarks, no command output)",
    "grtool/docid/lookup_files.py": "the docid lookup files, built in a temporary folder inside the claimed index and renamed in",
    "grtool/evaluation/compare.py": "draws the chart to the temporary path its caller's claim_file gives",
    "grtool/corpus/overlap.py": "draws the chart to the temporary path its caller's claim_file gives",
    "grtool/corpus/stats.py": "draws the chart to the temporary path its caller's claim_file gives",
    "grtool/triples/collisions.py": "draws the chart to the temporary path its caller's claim_file gives",
    "grtool/export/formats.py": "adds an export's entries to its folder's dataset_info.json (LLaMA-Factory's register), under the lock of updating()",
    "grtool/export/shuffle.py": "export's shuffle spill files in a temporary folder of its own",
    "grtool/holds.py": "test holds: the marker a held process leaves in the folder a test names (GRTOOL_HOLD)",
    "grtool/index/build.py": "the index, built in the temporary folder its part loop's DirectoryOutput made, which installs it (Claim.install)",
    "grtool/index/docid_bytes.py": "the bracket decoding files inside the index directory (INDEX's own entries)",
    "grtool/index/kinds.py": "the index kinds' files inside the index being built (its claim's temporary folder)",
    "grtool/index/stream.py": "the index builder's sorted runs: scratch files in a temporary folder of its own",
    "grtool/index/tokenizer.py": "the tokenizer file of an index, inside the index being built",
    "grtool/llm/cache.py": "the request cache (--cache-dir, or _llm_cache inside the claimed stage): added to, never replaced",
    "grtool/models.py": "the model cache (a converted GGUF), under grtool's own cache folder",
    "grtool/pipeline/runner.py": "a pipeline's records in OUT/_pipeline/ (no command writes there: refuse_record_path) and a stage's stdout file",
    "grtool/pipeline/slurm.py": "a Slurm run's job scripts, records and logs in OUT/_pipeline/slurm/",
    "grtool/train/run.py": "the trainer saving into its claimed checkpoint directory (its started and finished records, checkpoints)",
    "grtool/vocab/provenance.py": "the export's .grtool.json, written beside the export its claim holds",
}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _writes(call: ast.Call) -> bool:
    name = _name(call.func)
    if name in WRITING_FUNCTIONS or name.split(".")[-1] in ("atomic_write_bytes", "commit_file"):
        return True
    if name in ("open", "builtins_open", "builtins.open"):
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(c in mode.value for c in "wax+")
    if not isinstance(call.func, ast.Attribute):
        return False
    method = call.func.attr
    if method in WRITING_METHODS:
        return True
    if method == "rename":  # Path.rename(target); a frame's rename({...}) or rename(mapping=...) is no file
        return len(call.args) == 1 and not isinstance(call.args[0], ast.Dict) and not call.keywords
    if method == "replace":  # Path.replace(target); str.replace takes two
        return len(call.args) == 1 and not call.keywords
    return False


def file_system_writes() -> dict[str, list[int]]:
    """Module (relative to the repository) -> lines of its calls that create, replace or delete files."""
    found: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("grtool/store/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            if isinstance(node, ast.Call) and _writes(node):
                found.setdefault(relative, []).append(node.lineno)
    return found


def test_every_place_outside_store_that_writes_files_is_listed_with_its_reason():
    found = file_system_writes()
    unlisted = {module: lines for module, lines in found.items() if module not in ALLOWED}
    assert not unlisted, f"write through grtool.store.outputs (claim, claim_file) or list the module with why: {unlisted}"
    assert sorted(set(ALLOWED) - set(found)) == [], "listed but writes nothing any more: remove it from ALLOWED"


def test_commands_write_nothing_themselves():
    """The thin commands in grtool/cli/ write only through the claims (a report, a plot, a JSON summary)."""
    assert [module for module in file_system_writes() if module.startswith("grtool/cli/")] == []


def test_stage_directories_are_written_only_through_the_part_loop():
    """Every command that writes a stage directory runs on grtool.store.partloop.PartLoop (#45): outside grtool/store/
    nothing opens a stage writer itself (``StageWriter(...)``, ``open_output(...)``)."""
    opened = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith("grtool/store/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            if isinstance(node, ast.Call) and _name(node.func).split(".")[-1] in ("StageWriter", "open_output"):
                opened.setdefault(relative, []).append(node.lineno)
    assert opened == {}, f"run the stage on grtool.store.partloop.PartLoop: {opened}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The reader of the code is not blind: each kind of write it knows is found in a sample."""
    sample = """
import os, shutil
def f(p, q, frame, text):
    p.unlink(); q.mkdir(); p.write_text("x"); os.replace(p, q); shutil.rmtree(q); p.rename(q); p.replace(q)
    open(p, "wb"); open(p, mode="a"); open(p)
    frame.rename({"a": "b"}); text.replace("a", "b")
"""
    calls = [n for n in ast.walk(ast.parse(sample)) if isinstance(n, ast.Call)]
    assert sum(_writes(c) for c in calls) == 9
