"""`grtool report`: one self-contained HTML page of a run directory.

Everything comes from what the run already wrote: the pipeline's stage records (``_pipeline/<stage>.json``:
command, seconds, outputs), every stage's ``_manifest.json`` (rows, rejects by reason), the JSON reports the stages
printed (``corpus stats``, ``corpus overlap``, ``triples collisions``, ``eval recall``; told apart by their
content, not their names), the filter rejects (examples per reason), the exports' ``.grtool.json`` records, and
the PNG charts (``--plot``), embedded as base64. No row is re-read except the qids of chains stages, where
several stages of one kind (chained, filtered) hold questions or one does not count them, and the gold documents
and triples the gold coverage counts (:mod:`grtool.evaluation.gold_coverage`, in the corpus section,
``#coverage``). The page has inline CSS only: no script, no font, no address outside itself.

Sections have stable ids for links and tests: ``#stages``, ``#funnel``, ``#filters``, ``#corpus``,
``#coverage`` (in the corpus section), ``#collisions``, ``#overlap``, ``#eval``, ``#commands``.
"""

from __future__ import annotations

import base64
import html
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from grtool import __version__
from grtool.audit.discover import discover
from grtool.audit.validate import Report as Verdict, nothing_found, validate_tree
from grtool.errors import DataProblem, InputError
from grtool.records import DamagedRecord, read_json_record
from grtool.store.records import Manifest, load_manifest, now
from grtool.userinput import escaped

EXAMPLES_PER_REASON = 2
EXAMPLE_CHARS = 400  # of a rejected chain's text, on the page


@dataclass
class Stage:
    name: str  # the pipeline's stage name, else the directory relative to the run
    command: str
    seconds: float | None = None
    outputs: list[Path] = field(default_factory=list)
    manifests: list[tuple[Path, Manifest]] = field(default_factory=list)  # the stage directories it wrote
    exports: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)  # exported files and their records

    def words(self) -> list[str]:
        try:
            return shlex.split(self.command)
        except ValueError:
            return self.command.split()

    def option(self, name: str) -> str | None:
        words = self.words()
        for i, w in enumerate(words):
            if w == name and i + 1 < len(words):
                return words[i + 1]
            if w.startswith(name + "="):
                return w.split("=", 1)[1]
        return None

    def runs(self, *command: str) -> bool:
        """The stage runs ``grtool <command...>`` (options before the subcommand skipped)."""
        words = [w for w in self.words()[1:] if not w.startswith("-")]
        return words[: len(command)] == list(command)


@dataclass
class Run:
    path: Path
    stages: list[Stage]
    reports: dict[str, list[tuple[Path, dict[str, Any]]]]  # kind (stats, overlap, collisions, recall) -> files
    verdicts: list[Verdict] = field(default_factory=list)  # validate's, of everything grtool wrote under the run

    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]


# ------------------------------------------------------------------------------------------------ reading


def read_run(path: Path) -> Run:
    from grtool.store.status import find_stage_dirs

    if not path.is_dir():
        raise InputError(f"{path}: not a directory")
    if discover(path).nothing():  # a page of nothing would pass for a run that went well
        raise DataProblem(nothing_found(path).problems[0])
    stages = _pipeline_stages(path)
    claimed = {o.resolve() for s in stages for o in s.outputs}
    for d in find_stage_dirs(path):
        manifest = _manifest(d)
        if manifest is None:
            continue
        owner = next((s for s in stages if any(d.resolve() == o or _within(d.resolve(), o) for o in (x.resolve() for x in s.outputs))), None)
        if owner is None:  # a stage directory no pipeline record names: its own manifest says what made it
            owner = Stage(str(d.relative_to(path)) if d != path else d.name, shlex.join(manifest.command or []))  # as a shell reads it
            owner.outputs.append(d)
            stages.append(owner)
        owner.manifests.append((d, manifest))
    for record in sorted(path.rglob("*.grtool.json")):
        export = record.with_name(record.name[: -len(".grtool.json")])
        meta = _json(record)
        if not isinstance(meta, dict):
            continue
        owner = next((s for s in stages if export.resolve() in claimed and export.resolve() in {o.resolve() for o in s.outputs}), None)
        if owner is None:
            command = meta.get("command")
            owner = Stage(str(export.relative_to(path)), shlex.join(command) if isinstance(command, list) else "")
            stages.append(owner)
        owner.exports.append((export, meta))
    # The page says what validate says: a stopped, damaged or incomplete stage is marked, never shown as fine.
    return Run(path, stages, _reports(path, stages), validate_tree(path))


def _within(p: Path, parent: Path) -> bool:
    try:
        p.relative_to(parent)
        return True
    except ValueError:
        return False


def _json(path: Path) -> Any:
    try:
        return read_json_record(path, what="record")  # bounded: a damaged record is left out, never read whole
    except (OSError, DamagedRecord):
        return None


def _manifest(d: Path) -> Manifest | None:
    try:
        return load_manifest(d)
    except (InputError, DamagedRecord):  # an unreadable manifest is left out of the page (grtool validate names it)
        return None


def _pipeline_stages(path: Path) -> list[Stage]:
    """The stages a pipeline ran here, in the order they finished."""
    records = []
    for f in sorted((path / "_pipeline").glob("*.json")):
        r = _json(f)
        if isinstance(r, dict) and isinstance(r.get("stage"), str):
            records.append(r)
    records.sort(key=lambda r: str(r.get("finished") or ""))
    stages = []
    for r in records:
        seconds = r.get("seconds")
        outputs = [Path(o) for o in r.get("outputs") or [] if isinstance(o, str)]
        stages.append(Stage(r["stage"], str(r.get("command") or ""), float(seconds) if isinstance(seconds, (int, float)) else None, outputs))
    return stages


def report_kind(data: Any) -> str | None:
    """Which command's JSON report this is, by its fields."""
    if not isinstance(data, dict):
        return None
    if "recall" in data and "per_dataset" in data and "responses" in data:
        return "recall"
    if "distinct_triples" in data:
        return "collisions"
    if "ns" in data and "per_dataset" in data:
        return "overlap"
    if "groups" in data:
        return "stats"
    return None


def _reports(path: Path, stages: list[Stage]) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    # in the order the stages ran (base, then after SFT, then after KTO), then any other report by name
    files = list(dict.fromkeys(o for s in stages for o in s.outputs if o.suffix == ".json" and o.is_file()))
    files += sorted(set((path / "reports").glob("*.json")) - set(files)) if (path / "reports").is_dir() else []
    found: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for f in files:
        data = _json(f)
        kind = report_kind(data)
        if kind is not None:
            found.setdefault(kind, []).append((f, data))
    return found


def _plot(run: Run, *command: str) -> Path | None:
    """The chart a stage running ``command`` drew (its --plot), else none."""
    for s in run.stages:
        if s.runs(*command) and (p := s.option("--plot")):
            plot = Path(p)
            if plot.is_file():
                return plot
    return None


# ------------------------------------------------------------------------------------------------ numbers


def funnel(run: Run) -> list[tuple[str, str, float | None]]:
    """(step, what it counts, number) for questions → chained → kept → exported → recall, with the rows each stage
    merged (folded into an identical row: duplicate documents, repeated triples) after the questions. A question is
    counted once per step however many stage directories of that kind hold it (synthesized and gold chains, a
    re-run into a new directory)."""
    questions = _rows_of(run, "questions", lambda s: s.runs("corpus", "merge")) or _rows_of(run, "questions", lambda s: True)
    steps: list[tuple[str, str, float | None]] = [("questions", "questions in the corpus", questions)]
    for s in run.stages:
        for d, m in s.manifests:
            if m.counters.merged:
                steps.append(("merged", f"{m.table} rows folded into an identical one ({_shown(d, run.path)})", m.counters.merged))
    chains = [(d, m) for s in run.stages for d, m in s.manifests if m.table == "chains" and not _is_filtered(m)]
    steps.append(("chained", "questions with a chain", _questions(chains, "questions_chained") if chains else None))
    filtered = [(d, m) for s in run.stages for d, m in s.manifests if _is_filtered(m)]
    kept = _questions(filtered, "kept", selected=True) if filtered else None
    steps.append(("kept", "questions with a chain that passed the filters", kept))
    sft = [meta for s in run.stages for _, meta in s.exports if meta.get("kind") == "sft"]
    steps.append(("exported", "SFT rows exported", sum(int(m.get("rows") or 0) for m in sft) if sft else None))
    for f, data in run.reports.get("recall", []):
        overlap = _overlap(data)
        steps.append((f"recall ({_label(f)})", f"mean recall over {data.get('responses')} responses" + (f" ({overlap})" if overlap else ""), data.get("recall")))
    return steps


def _overlap(report: dict[str, Any]) -> str | None:
    """The training overlap of a recall report, said beside its number: allowed (`eval recall
    --allow-train-overlap`), or refused (the run exited 1, its report written all the same); a verdict that is not
    what `eval recall` writes is said as such."""
    from grtool.evaluation.overlap import RecordedOverlap, overlap_problem

    recorded = report.get("train_overlap")
    try:
        verdict = msgspec.convert(recorded, RecordedOverlap) if recorded else None
    except msgspec.ValidationError as e:
        return f"its train_overlap is not what `eval recall` writes ({e})"
    problem = overlap_problem(verdict)
    if problem is None:
        return None
    return {True: "training overlap allowed", False: "training overlap refused (eval recall exited 1)", None: "training overlap"}[verdict.allowed] + f": {problem}"


def _rows_of(run: Run, table: str, which) -> int | None:
    for s in run.stages:
        if which(s):
            for _, m in s.manifests:
                if m.table == table and m.rows is not None:
                    return m.rows
    return None


def _is_filtered(manifest: Manifest) -> bool:
    return manifest.table == "chains" and "filters" in (manifest.command or [])[:4]


def _questions(stages: list[tuple[Path, Manifest]], counter: str, selected: bool = False) -> int:
    """Distinct questions in the chains stages of one kind: the stage's own count when it is the only one and
    counted them (``counter``: ``questions_chained``, or ``kept`` of a filters stage that keeps one chain per
    question), else the distinct qids of their rows (``selected``: of the chains marked kept only)."""
    if len(stages) == 1:
        manifest = stages[0][1]
        counted = manifest.counters.extra.get(counter)
        if counted is not None and not manifest.params.get("all_candidates"):
            return counted
    from grtool.store.stage import iter_batches

    qids: set[str] = set()
    for stage, _ in stages:
        for batch in iter_batches(stage, ["qid", "selected"] if selected else ["qid"]):
            rows = batch.filter(batch.column("selected")) if selected else batch
            qids.update(rows.column("qid").to_pylist())
    return len(qids)


def _shown(path: Path, root: Path) -> str:
    """A path under the run relative to it, others as they are."""
    return str(path.relative_to(root)) if _within(path, root) else str(path)


def _label(f: Path) -> str:
    return f.stem.removeprefix("recall-")


def filter_reasons(stage: Path, manifest: Manifest) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """(reason code, chains, examples) of a filters stage, most frequent first."""
    from collections import Counter

    from grtool.filters.apply import examples_from_rejects

    counts = Counter({k: v for k, v in manifest.counters.extra.items() if k.startswith("reason/")})
    examples = examples_from_rejects(stage, counts, {})
    return [(key.split("/", 1)[1], n, examples.get(key.split("/", 1)[1], [])[:EXAMPLES_PER_REASON]) for key, n in counts.most_common()]


# ------------------------------------------------------------------------------------------------ HTML

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:72rem;padding:0 1rem;color:#1d2430;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{border-bottom:1px solid #d6dbe3;padding-bottom:.2rem;margin-top:2.2rem}
nav a{margin-right:.9rem}table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #d6dbe3;padding:.25rem .55rem;text-align:left;vertical-align:top}th{background:#f1f4f8}
td.n{text-align:right;font-variant-numeric:tabular-nums}code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.82rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
.bar{background:#4c78a8;height:.9rem;display:inline-block;vertical-align:middle}.muted{color:#69707d}
img{max-width:100%;border:1px solid #d6dbe3;margin:.5rem 0}.example{margin:.2rem 0 .6rem 0}
.fail{color:#a4161a;border-left:4px solid #a4161a;padding-left:.6rem}.ok{color:#2b7a0b}
"""

SECTIONS = (
    ("stages", "Stages"),
    ("funnel", "Funnel"),
    ("filters", "Filters"),
    ("corpus", "Corpus"),
    ("collisions", "Collisions"),
    ("overlap", "Overlap"),
    ("eval", "Recall"),
    ("commands", "Commands"),
)


def e(value: Any) -> str:
    """Text for the page: HTML-escaped, and control characters from data and paths (an ESC, a CR) shown as escapes,
    as every other printer shows them; line breaks stay (commands and messages in <pre> blocks)."""
    return html.escape("\n".join(escaped(line) for line in str(value).split("\n")), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{e(_num(c))}</td>' if i in numeric else f"<td>{c if isinstance(c, _Raw) else e(c)}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Raw(str):
    """HTML already escaped (put in a table cell as is)."""


def _image(path: Path | None, alt: str) -> str:
    if path is None or not path.is_file():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{e(alt)}" src="data:image/png;base64,{data}">'


def _verdicts_html(run: Run) -> str:
    """What validate finds wrong, above the stages: every failing stage, index or export with its problems."""
    failed = run.failed()
    if not failed:
        return f'<p class="ok">validate: all {len(run.verdicts)} checked outputs ok</p>'
    items = "".join(f"<li><code>{e(_shown(Path(v.path), run.path))}</code>: FAIL<ul>{''.join(f'<li>{e(p)}</li>' for p in v.printable()['problems'])}</ul></li>"
                    for v in failed)  # fmt: skip
    return f'<div class="fail"><p>validate: {len(failed)} of {len(run.verdicts)} checked outputs FAIL (grtool validate {e(run.path)})</p><ul>{items}</ul></div>'


def _stages_html(run: Run) -> str:
    verdict = {Path(v.path).resolve(): "ok" if v.ok else "FAIL" for v in run.verdicts}  # why: listed above the table
    rows = []
    for s in run.stages:
        # (where, table, rows in, rows, rejected by reason) of each output: an export counts its rows alone
        made = [(str(d.relative_to(run.path)) if _within(d, run.path) else str(d), m.table, m.counters.in_, m.rows, m.counters.rejected) for d, m in s.manifests]
        made += [(str(f.relative_to(run.path)) if _within(f, run.path) else str(f), f"export {m.get('kind')}", None, m.get("rows"), {}) for f, m in s.exports]
        seconds = f"{s.seconds:.1f}" if s.seconds is not None else "-"
        if not made:  # reports, plots, an index, a checkpoint: named, without rows
            where = ", ".join(str(o.relative_to(run.path)) if _within(o, run.path) else str(o) for o in s.outputs) or "-"
            rows.append([s.name, where, "", None, None, "", seconds, ""])
        paths = [d for d, _ in s.manifests] + [f for f, _ in s.exports]
        for i, ((where, table, rows_in, rows_out, rejected), path) in enumerate(zip(made, paths)):
            reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(rejected.items(), key=lambda kv: -kv[1]))
            rows.append(
                [s.name if i == 0 else "", where, table, rows_in, rows_out, reasons or "0", seconds if i == 0 else "", verdict.get(path.resolve(), "")]
            )  # the stage's time once, on its first output
    return _verdicts_html(run) + _table(["stage", "output", "table", "rows in", "rows", "rejected by reason", "seconds", "validate"], rows, numeric={3, 4, 6})


def _funnel_html(run: Run) -> str:
    steps = funnel(run)
    top = next((n for _, _, n in steps if isinstance(n, int) and n), None)
    rows = []
    for step, what, n in steps:
        if step == "merged":  # rows of a stage, not questions: no share of the questions
            bar = _Raw('<span class="muted">rows, not questions</span>')
        elif isinstance(n, int) and top:
            bar = _Raw(f'<span class="bar" style="width:{max(1, round(240 * n / top))}px"></span> {n / top:.0%} of the questions')
        elif isinstance(n, float):
            bar = _Raw(f'<span class="bar" style="width:{max(1, round(240 * n))}px"></span>')
        else:
            bar = _Raw('<span class="muted">not in this run</span>')
        rows.append([step, what, n, bar])
    return _table(["step", "counts", "number", ""], rows, numeric={2})


def _filters_html(run: Run) -> str:
    parts = []
    for s in run.stages:
        for d, m in s.manifests:
            if not _is_filtered(m):
                continue
            parts.append(f'<h3>{e(s.name)} <span class="muted">({e(d)})</span></h3>')
            parts.append(f"<p>{_num(m.counters.in_)} chains judged, {_num(m.rows)} passed, {_num(m.counters.extra.get('kept'))} kept (one per question).</p>")
            reasons = filter_reasons(d, m)
            if not reasons:
                parts.append("<p>No chain was rejected.</p>")
                continue
            rows = []
            for code, n, examples in reasons:
                shown = "".join(
                    f'<div class="example"><code>{e(x.get("qid"))}</code> candidate {e(x.get("candidate"))}: {e(x.get("detail"))}<pre>{e(str(x.get("text") or "")[:EXAMPLE_CHARS])}</pre></div>'
                    for x in examples
                )
                rows.append([code, n, _Raw(shown)])
            parts.append(_table(["reason", "chains", "examples"], rows, numeric={1}))
    return "".join(parts) or '<p class="muted">No filters stage in this run.</p>'


def _corpus_html(run: Run) -> str:
    parts = []
    for f, data in run.reports.get("stats", []):
        rows = [
            [g.get("dataset"), g.get("split"), g.get("questions"), g.get("documents"), g.get("gold_documents"), (g.get("gold_per_question") or {}).get("mean"), g.get("answerable_share")]
            for g in data.get("groups") or []
            if isinstance(g, dict)
        ]
        parts.append(
            f'<p class="muted">{e(f.name)}</p>' + _table(["dataset", "split", "questions", "documents", "gold documents", "gold per question", "answerable share"], rows, numeric={2, 3, 4, 5, 6})
        )
    parts.append(_image(_plot(run, "corpus", "stats"), "corpus stats"))
    parts += _coverage_html(run)
    return "".join(parts) or '<p class="muted">No corpus stats in this run.</p>'


def _coverage_html(run: Run) -> list[str]:
    """Per questions stage whose run holds triples: the share of gold documents with a docid, per dataset and split."""
    from grtool.errors import GrtoolError
    from grtool.evaluation.gold_coverage import COVERAGE_HEADERS, coverage_rows, coverage_warning, gold_coverage, triples_of_corpus

    parts = []
    for questions in (d for s in run.stages for d, m in s.manifests if m.table == "questions"):
        triples = triples_of_corpus(questions)
        if triples is None:
            continue
        where = f"{_shown(questions, run.path)} by {_shown(triples, run.path)}"
        try:
            coverage = gold_coverage(questions, triples)
        except GrtoolError as err:  # a damaged stage: named, the rest of the page still written
            parts.append(f'<p class="muted">Gold coverage of {e(where)} not counted: {e(err)}</p>')
            continue
        warning = coverage_warning(coverage)
        parts.append(f'<h3>Gold coverage <span class="muted">({e(where)})</span></h3>'
                     "<p>Gold documents that hold at least one docid; a question with none has recall 0 whatever the model does.</p>"
                     + _table(COVERAGE_HEADERS, coverage_rows(coverage), numeric={2, 3, 4, 6})
                     + (f"<p><strong>{e(warning)}</strong></p>" if warning else ""))  # fmt: skip
    return [f'<div id="coverage">{"".join(parts)}</div>'] if parts else []


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if _within(path, root) else str(path)


def _collisions_html(run: Run) -> str:
    parts = []
    for f, data in run.reports.get("collisions", []):
        facts = [
            ["distinct triples", data.get("distinct_triples")],
            ["in 2+ documents", data.get("in_2plus_docs")],
            ["share in 2+ documents", data.get("share_in_2plus_docs")],
            ["in 3+ documents", data.get("in_3plus_docs")],
            ["documents", data.get("documents")],
        ]
        for reason, d in (data.get("dropped") or {}).items():
            if isinstance(d, dict):
                facts.append([f"dropped: {reason}", d.get("dropped")])
        parts.append(f'<p class="muted">{e(f.name)}</p>' + _table(["", "number"], facts, numeric={1}))
        top = [[t.get("docid"), t.get("documents")] for t in data.get("top_colliding") or [] if isinstance(t, dict)]
        if top:
            parts.append("<p>Triples held by the most documents:</p>" + _table(["docid", "documents"], top, numeric={1}))
    parts.append(_image(_plot(run, "triples", "collisions"), "triples collisions"))
    return "".join(parts) or '<p class="muted">No collisions report in this run.</p>'


def _overlap_html(run: Run) -> str:
    parts = []
    for f, data in run.reports.get("overlap", []):
        ns = [str(n) for n in data.get("ns") or []]
        per_dataset = [(name, d) for name, d in (data.get("per_dataset") or {}).items() if isinstance(d, dict)]
        for key, what in (
            ("mean", "Mean share of a question's n-grams found verbatim in its gold documents"),
            ("share_with_overlap", "Share of questions with at least one n-gram found verbatim in their gold documents"),
        ):
            rows = [[name, d.get("questions"), *[(d.get(key) or {}).get(n) for n in ns]] for name, d in per_dataset]
            parts.append(f"<p>{e(what)} ({e(f.name)}):</p>" + _table(["dataset", "questions", *[f"n={n}" for n in ns]], rows, numeric=set(range(1, len(ns) + 2))))
    parts.append(_image(_plot(run, "corpus", "overlap"), "corpus overlap"))
    return "".join(parts) or '<p class="muted">No overlap report in this run.</p>'


def _eval_html(run: Run) -> str:
    parts = []
    for f, data in run.reports.get("recall", []):
        rows = [
            [name, r.get("responses"), r.get("recall"), r.get("exact_match_share"), r.get("docs_per_response"), r.get("hallucinated_share"), r.get("malformed")]
            for name, r in [*(data.get("per_dataset") or {}).items(), ("all", data)]
            if isinstance(r, dict)
        ]
        parts.append(
            f'<h3>{e(_label(f))} <span class="muted">({e(f.name)})</span></h3>'
            + _table(["dataset", "responses", "recall", "exact", "docs/response", "hallucinated share", "malformed"], rows, numeric={1, 2, 3, 4, 5, 6})
        )
        if isinstance(data.get("coverage"), dict) and (warning := _recall_coverage(data["coverage"])):
            parts.append(f"<p><strong>{e(warning)}</strong></p>")
        if overlap := _overlap(data):
            parts.append(f"<p><strong>{e(overlap)}</strong></p>")
    for s in run.stages:
        if s.runs("eval", "compare"):
            out = s.option("--out") or s.option("-o")
            if out and Path(out).is_file():
                parts.append(f"<h3>{e(s.name)}</h3><pre>{e(Path(out).read_text(errors='replace'))}</pre>")
    parts.append(_image(_plot(run, "eval", "compare"), "recall compared"))
    return "".join(parts) or '<p class="muted">No recall result in this run.</p>'


def _recall_coverage(coverage: dict[str, Any]) -> str | None:
    """The warning line of an `eval recall` report's gold coverage (None at 100%, or for a report it cannot read)."""
    from grtool.evaluation.gold_coverage import coverage_warning

    try:
        return coverage_warning(coverage)
    except (KeyError, TypeError):  # a report edited by hand or written by another version: left out
        return None


def _commands_html(run: Run) -> str:
    return "".join(f"<h3>{e(s.name)}</h3><pre>{e(s.command or '(not recorded)')}</pre>" for s in run.stages) or '<p class="muted">No stage.</p>'


def render(run: Run) -> str:
    bodies = {
        "stages": _stages_html,
        "funnel": _funnel_html,
        "filters": _filters_html,
        "corpus": _corpus_html,
        "collisions": _collisions_html,
        "overlap": _overlap_html,
        "eval": _eval_html,
        "commands": _commands_html,
    }
    sections = "".join(f'<section id="{sid}"><h2>{e(title)}</h2>{bodies[sid](run)}</section>' for sid, title in SECTIONS)
    nav = "".join(f'<a href="#{sid}">{e(title)}</a>' for sid, title in SECTIONS)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>grtool report: {e(run.path.name)}</title><style>{CSS}</style></head><body>"
        f'<h1>grtool report</h1><p class="muted">{e(run.path)} · written {e(now())} by grtool {e(__version__)}</p>'
        f"<nav>{nav}</nav>{sections}</body></html>\n"
    )


def write_report(run_dir: Path, out: Path | None) -> tuple[Path, list[Verdict]]:
    """Read the run, write the page atomically; returns where, and validate's failing verdicts (marked on the page)."""
    from grtool.store.outputs import refuse_output_among_inputs
    from grtool.store.partloop import claim_file

    target = out if out is not None else run_dir / "reports" / "report.html"
    if str(target) == "-":
        raise InputError("--out -: the report is an HTML file; name the file to write")
    if not run_dir.is_dir():  # before the claim, which makes the folder of the page's lock (inside it, by default)
        raise InputError(f"{run_dir}: not a directory")
    with claim_file(target, holders=[run_dir]) as claimed:
        run = read_run(run_dir)
        inputs = [d for s in run.stages for d, _ in s.manifests] + [f for s in run.stages for f, _ in s.exports]
        refuse_output_among_inputs(target, inputs=inputs)
        return claimed.write(render(run).encode()), run.failed()
