"""`grtool eval compare`: recall of several runs side by side (the demo's base few-shot / SFT / KTO table).

Each run is ``LABEL=PATH``: a JSON report of `grtool eval recall --json`, or a `grtool retrieve` output directory,
scored here with the questions and triples its manifest names. The output is Markdown: recall per dataset (one
column per run), every overall metric, and per-question wins and losses of each run against a baseline;
optionally a grouped bar chart. Runs scored on different questions are refused unless allowed: recall over
other questions is another number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from grtool.errors import DataProblem, InputError
from grtool.evaluation.overlap import RecordedOverlap, overlap_problem
from grtool.evaluation.significance import RESAMPLES, SEED, TEST, paired_test
from grtool.records import Count, DamagedRecord, Fraction, Seconds, Sha256, decode_record
from grtool.userinput import escaped, read_input_bytes
from grtool.records import Report

NO_LIST = "Wins and losses need per-question recall of both runs"
SAME_RECALL = 1e-9  # means over samples are sums of fractions: equal up to rounding is the same


@dataclass
class Run:
    label: str
    source: Path
    report: RecallReport
    # qid → recall (the mean over its responses); None when the report has no per-question list
    recalls: dict[str, float] | None = field(init=False)
    datasets: dict[str, str] = field(init=False)  # qid → dataset, for the per-question lists

    def __post_init__(self) -> None:
        entries = self.report.questions
        scored = None if entries is None else [e for e in entries if e.status == "scored"]
        self.recalls = None if scored is None else {e.qid: e.recall for e in scored}
        self.datasets = {e.qid: e.dataset for e in scored or ()}


@dataclass
class Inputs:
    """``--corpus`` / ``--triples`` of `eval compare` (override what a directory's manifest names), and the
    lookups already built, shared by the directories that name the same stages."""

    corpus: Path | None = None
    triples: Path | None = None
    built: dict[tuple[str, str], Any] = field(default_factory=dict)

    def lookup(self, kind: str, path: str | Path):
        key = (kind, str(Path(path).resolve()))
        if key not in self.built:
            from grtool.vocab.readers import DocidIndex, QuestionIndex

            self.built[key] = QuestionIndex.build(path) if kind == "questions" else DocidIndex.build(path)
        return self.built[key]


def split_spec(spec: str) -> tuple[str, Path]:
    """``LABEL=PATH`` → (label, path), split at the first ``=`` (a path may hold more: ``lr5=sweep/lr=1e-5/r.json``);
    a spec that is an existing path as a whole is a bare PATH, labelled by its name (a file's stem)."""
    label, _, path = ("", "", spec) if "=" not in spec or Path(spec).exists() else spec.partition("=")
    p = Path(path)
    return label or (p.stem if p.is_file() else p.name), p


def load_runs(specs: list[str], inputs: Inputs | None = None, baseline: str | None = None) -> list[Run]:
    """Every ``LABEL=PATH`` as a :class:`Run`. The labels are checked before any directory is scored: one given
    twice is refused (its column would be ambiguous), and so is a ``baseline`` no run has."""
    named = [split_spec(spec) for spec in specs]
    if not named:
        raise InputError("name at least one recall report or responses directory")
    first: dict[str, Path] = {}
    for label, p in named:
        if label in first:
            raise InputError(f"label {label!r} is given twice ({first[label]} and {p}): give each run its own LABEL=PATH")
        first[label] = p
    check_baseline(baseline, list(first))
    inputs = inputs or Inputs()
    return [Run(label, p, score_directory(p, inputs) if p.is_dir() else read_report(p)) for label, p in named]


class _Entry(msgspec.Struct):
    qid: str
    status: str
    recall: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    dataset: str | None = None


class _QuestionSet(msgspec.Struct):
    count: Count
    sha256: Sha256


class _Tally(msgspec.Struct):
    recall: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None


class _Seconds(msgspec.Struct):
    mean: Seconds | None = None
    p50: Seconds | None = None


class RecallReport(msgspec.Struct):
    """What `eval compare` reads of a report of `eval recall --json` (the fields it does not show are not read);
    older reports lack the later fields (None)."""

    recall: Fraction | None
    per_dataset: dict[str, _Tally]
    questions_scored: Count | None = None
    question_set: _QuestionSet | None = None
    questions: list[_Entry] | None = None
    train_overlap: RecordedOverlap | None = None
    responses: Count | None = None
    exact_match_share: Fraction | None = None
    docids: Count | None = None
    hallucinated: Count | None = None
    hallucinated_share: Fraction | None = None
    without_response: Count | None = None
    seconds_per_query: _Seconds | None = None


def read_report(p: Path) -> RecallReport:
    """A report of `eval recall --json`, decoded through :class:`RecallReport` (a damaged one is one line naming the
    field, never a traceback)."""
    data = read_input_bytes(p)
    try:  # the one decoding of a record: a key given twice too is damage, never read last-wins
        return decode_record(data, RecallReport, source=p, what="report")
    except DamagedRecord as e:
        raise InputError(f"{p}: not a JSON report of `grtool eval recall --json` ({str(e).removeprefix(f'{p}: ')})") from None


def score_directory(p: Path, inputs: Inputs) -> RecallReport:
    """`eval recall --per-question` of a `retrieve` directory, with the stages its manifest names unless
    ``--corpus`` / ``--triples`` say otherwise."""
    from grtool.evaluation.overlap import train_overlap
    from grtool.evaluation.per_question import PerQuestion
    from grtool.evaluation.recall import evaluate_recall, query_seconds
    from grtool.evaluation.selection import needs_triples, recorded_inputs, selected_questions

    questions, triples = recorded_inputs(p)
    corpus = inputs.corpus or questions
    docids = needs_triples(p)  # BM25 and GMR rows name their documents: no triples to look them up in
    triples = (inputs.triples or triples) if docids else None
    for flag, value in [("--corpus", corpus)] + ([("--triples", triples)] if docids else []):
        if value is None or not Path(value).exists():
            raise InputError(f"{p}: its manifest names no {flag[2:]} stage that still exists; pass {flag}")
    assert corpus is not None
    report = evaluate_recall(
        p, inputs.lookup("questions", corpus), inputs.lookup("triples", triples) if triples is not None else None,
        selected=selected_questions(p, corpus), per_question=PerQuestion(corpus),
    )  # fmt: skip
    report["seconds_per_query"] = query_seconds(p)
    report["train_overlap"] = train_overlap(p).as_dict()  # as `eval recall` records it in its report
    if report["responses"] == 0:
        raise DataProblem(f"{p}: no response could be scored (unknown qids or no gold documents)")
    return msgspec.convert(report, RecallReport)  # read as a report file is


# ------------------------------------------------------------------------------------------- questions


def check_same_questions(runs: list[Run], allow: bool) -> list[str]:
    """Refuse runs scored on other questions than the first (by qid where both reports list them, else by
    count); with ``allow`` the differences are returned as warnings instead. Reports of an older grtool, which
    count neither, cannot be checked: said as a warning."""
    base, problems, unchecked = runs[0], [], []
    for run in runs[1:]:
        if base.recalls is not None and run.recalls is not None:
            only_base, only_run = len(base.recalls.keys() - run.recalls.keys()), len(run.recalls.keys() - base.recalls.keys())
            if only_base or only_run:
                problems.append(f"{base.label!r} {len(base.recalls)} and {run.label!r} {len(run.recalls)} questions "
                                f"({only_base} only in {base.label!r}, {only_run} only in {run.label!r})")  # fmt: skip
            continue
        sets = base.report.question_set, run.report.question_set
        counts = base.report.questions_scored, run.report.questions_scored
        if sets[0] is not None and sets[1] is not None:  # both name their question set: equal digests are the same questions
            if sets[0] != sets[1]:
                same_count = " (as many, but other ones)" if sets[0].count == sets[1].count else ""
                problems.append(f"{base.label!r} {sets[0].count} and {run.label!r} {sets[1].count} questions{same_count}")
        elif None in counts:
            unchecked.append(run.label)
        elif counts[0] != counts[1]:
            problems.append(f"{base.label!r} {counts[0]} and {run.label!r} {counts[1]} questions")
    warnings = [f"cannot check that {', '.join(map(repr, unchecked))} scored the questions {base.label!r} did (a report without questions_scored)"] if unchecked else []
    if problems and not allow:
        raise InputError("runs scored on different questions: " + "; ".join(problems) + ". Recall over other questions is not "
                         "comparable: score the same questions (the same --split/--dataset/--limit), or pass --allow-different-questions")  # fmt: skip
    return warnings + [f"runs scored on different questions: {p}; wins and losses count the common ones" for p in problems]


def check_train_overlap(runs: list[Run], allow: bool) -> list[str]:
    """The training-overlap verdict of each run, as `eval recall` gives it (recorded in a report, or asked of a
    responses directory): questions the model trained on, or a verdict that could not be reached, refuse the
    comparison (exit 1) unless ``allow``, which returns them as lines every output of the comparison carries.
    A report of an older grtool records no verdict: not checked."""
    problems = [f"{run.label!r} ({run.source}): {problem}" for run in runs if (problem := overlap_problem(run.report.train_overlap))]
    if problems and not allow:
        raise DataProblem("; ".join(problems) + ": recall on training questions measures memory, not retrieval; score held-out questions "
                          "(retrieve --split), or pass --allow-train-overlap")  # fmt: skip
    return [f"training overlap allowed: {p}" for p in problems]


def wins_and_losses(base: Run, run: Run, listed: bool = False) -> dict[str, Any] | None:
    """Per question of both runs: is ``run``'s recall above, below or equal to ``base``'s? None when either report
    has no per-question list. ``listed``: also every question whose recall changed."""
    if base.recalls is None or run.recalls is None:
        return None
    common = sorted(base.recalls.keys() & run.recalls.keys())
    delta = {q: run.recalls[q] - base.recalls[q] for q in common}
    result: dict[str, Any] = {
        "baseline": base.label,
        "questions": len(common),
        "better": sum(d > SAME_RECALL for d in delta.values()),
        "worse": sum(d < -SAME_RECALL for d in delta.values()),
    }
    result["same"] = len(common) - result["better"] - result["worse"]
    result["significance"] = paired_test(base.recalls, run.recalls)
    if listed:
        result["changed"] = [
            {"qid": q, "dataset": base.datasets.get(q), "baseline": base.recalls[q], "recall": run.recalls[q]}
            for q in common if abs(delta[q]) > SAME_RECALL
        ]  # fmt: skip
    return result


# ------------------------------------------------------------------------------------------- output


def table(runs: list[Run]) -> dict[str, dict[str, float | None]]:
    """dataset (and "all") → label → recall."""
    datasets = sorted({d for r in runs for d in r.report.per_dataset})
    rows: dict[str, dict[str, float | None]] = {}
    for name in [*datasets, "all"]:
        rows[name] = {}
        for run in runs:
            entry = run.report if name == "all" else run.report.per_dataset.get(name)
            rows[name][run.label] = entry.recall if entry is not None else None
    return rows


METRICS = (  # (row name, report key): the overall figures, one row each
    ("recall", "recall"),
    ("exact set", "exact_match_share"),
    ("hallucinated docids", "hallucinated"),
    ("questions scored", "questions_scored"),
    ("responses scored", "responses"),
    ("questions without a row", "without_response"),
    ("seconds per query (mean)", "seconds_per_query_mean"),
    ("seconds per query (p50)", "seconds_per_query_p50"),
)


def metrics(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """label → the overall metrics (None where the report does not say)."""
    out = {}
    for run in runs:
        r = run.report
        seconds = r.seconds_per_query or _Seconds()
        out[run.label] = {key: getattr(r, key, None) for _, key in METRICS} | {"docids": r.docids, "hallucinated_share": r.hallucinated_share,
                                                                              "seconds_per_query_mean": seconds.mean, "seconds_per_query_p50": seconds.p50}  # fmt: skip
    return out


def comparison(runs: list[Run], baseline: str | None = None, listed: bool = False) -> dict[str, dict[str, Any] | None]:
    """label → wins and losses against the baseline (the first run unless named), for every other run."""
    base = _baseline(runs, baseline)
    return {run.label: wins_and_losses(base, run, listed) for run in runs if run is not base}


def _baseline(runs: list[Run], baseline: str | None) -> Run:
    check_baseline(baseline, [run.label for run in runs])
    return next(run for run in runs if run.label == baseline) if baseline is not None else runs[0]


def check_baseline(baseline: str | None, labels: list[str]) -> None:
    if baseline is not None and baseline not in labels:
        raise InputError(f"--baseline {baseline!r}: no run has that label (labels: {', '.join(map(repr, labels))})")


def _cell(key: str, m: dict[str, Any]) -> str:
    value = m[key]
    if value is None:
        return "-"
    if key == "hallucinated":
        share = m["hallucinated_share"]
        return f"{value}/{m['docids']}" + (f" ({share:.3f})" if share is not None else "")
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _md(text: object) -> str:
    """A label, a dataset or a qid as one Markdown table cell: control characters escaped, ``|`` too (it would
    split the cell)."""
    return escaped(str(text)).replace("|", "\\|")


def markdown(runs: list[Run], title: str = "Retrieval recall", baseline: str | None = None, listed: bool = False) -> str:
    rows = table(runs)
    labels = [run.label for run in runs]
    header = ["| " + " | ".join(map(_md, labels)) + " |", "|---|" + "---:|" * len(labels)]
    lines = [f"# {title}", "", "| dataset " + header[0], header[1]]
    for name, values in rows.items():
        cells = ["-" if values[label] is None else f"{values[label]:.4f}" for label in labels]
        lines.append(f"| {'**all**' if name == 'all' else _md(name)} | " + " | ".join(cells) + " |")
    lines += ["", "## Metrics", "", "| metric " + header[0], header[1]]
    figures = metrics(runs)
    for name, key in METRICS:
        lines.append(f"| {name} | " + " | ".join(_cell(key, figures[label]) for label in labels) + " |")
    if len(runs) > 1:
        base = _baseline(runs, baseline)
        results = comparison(runs, baseline, listed)
        lines += ["", f"## Per question against {_md(base.label)}", ""]
        if any(r is not None for r in results.values()):
            lines += ["| run | better | worse | same | questions in both | Δ recall | 95% interval | p |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for label, result in results.items():
                cells = ["-"] * 7 if result is None else [str(result[k]) for k in ("better", "worse", "same", "questions")] + _significance_cells(result["significance"])
                lines.append(f"| {_md(label)} | " + " | ".join(cells) + " |")
            lines += ["", f"p: {TEST} ({RESAMPLES:,} draws, seed {SEED}), over the questions both runs answered."]
        if any(r is None for r in results.values()):
            if lines[-1]:  # after the table
                lines.append("")
            lines.append(f"{NO_LIST}: score a responses directory here, or use `eval recall --per-question --json`.")
        for label, result in results.items():
            if listed and result is not None and result["changed"]:
                lines += ["", f"### {_md(label)} against {_md(base.label)}", "", f"| qid | dataset | {_md(base.label)} | {_md(label)} |", "|---|---|---:|---:|"]
                lines += [f"| {_md(c['qid'])} | {_md(c['dataset'])} | {c['baseline']:.4f} | {c['recall']:.4f} |" for c in result["changed"]]
    return "\n".join(lines) + "\n"


def _significance_cells(sig: dict[str, Any]) -> list[str]:
    if sig["p_value"] is None:
        return ["-"] * 3
    low, high = sig["ci95"]
    return [f"{sig['difference']:+.4f}", f"[{low:+.4f}, {high:+.4f}]", _p(sig["p_value"])]


def _p(p: float) -> str:
    return "1" if p == 1 else f"{p:.4f}" if p >= 1e-4 else "< 0.0001"


def paper_markdown(runs: list[Run], title: str = "Retrieval recall", baseline: str | None = None) -> str:
    """Table 1's shape: one row per run, one column per dataset, their Average (the mean over datasets, each
    weighing the same), seconds per query, and the paired test against the baseline."""
    datasets = sorted({d for r in runs for d in r.report.per_dataset})
    base = _baseline(runs, baseline)
    tests = comparison(runs, baseline)
    figures = metrics(runs)
    lines = [f"# {title}", "", "| run | " + " | ".join(map(_md, datasets)) + f" | Average | s/query | p vs {_md(base.label)} |", "|---|" + "---:|" * (len(datasets) + 3)]
    for run in runs:
        recalls = [tally.recall if (tally := run.report.per_dataset.get(d)) is not None else None for d in datasets]
        known = [r for r in recalls if r is not None]
        average = sum(known) / len(known) if known and len(known) == len(recalls) else None
        seconds = figures[run.label]["seconds_per_query_mean"]
        result = tests.get(run.label)
        p = "-" if result is None or result["significance"]["p_value"] is None else _p(result["significance"]["p_value"])
        cells = ["-" if r is None else f"{100 * r:.1f}" for r in [*recalls, average]] + ["-" if seconds is None else f"{seconds:.3g}", p]
        lines.append(f"| {_md(run.label)} | " + " | ".join(cells) + " |")
    lines += ["", f"Recall in percent; Average: the mean over the datasets. p: {TEST} ({RESAMPLES:,} draws, seed {SEED})."]
    return "\n".join(lines) + "\n"


def plot(runs: list[Run], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table(runs)
    names = list(rows)
    labels = [run.label for run in runs]
    width = 0.8 / len(labels)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(names), 3.6))
    for k, label in enumerate(labels):
        xs = [i + (k - (len(labels) - 1) / 2) * width for i in range(len(names))]
        ax.bar(xs, [rows[n][label] or 0.0 for n in names], width, label=label)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("recall")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")
    ax.set_title("Retrieval recall per dataset")
    fig.tight_layout()
    fig.savefig(path, dpi=120)  # the path its caller's claim gives (grtool.store.partloop.claim_file)
    plt.close(fig)
    return Path(path)


class CompareReport(Report, kw_only=True):
    """``eval compare --json``: recall per dataset and run, every run's metrics, the per-question comparison and
    the training overlaps each number includes."""

    recall: dict[str, dict[str, Any]]
    metrics: dict[str, dict[str, Any]]
    per_question: dict[str, Any]
    train_overlap: list[str]
