"""The filter report: counts per rule, per reason and per dataset, pass rate, the yield (questions with a kept
chain / questions synthesized), the questions lost per rule, two examples per failure."""

from __future__ import annotations

from collections import Counter
from typing import Any
import msgspec
from grtool.records import Report


def build_report(counts: Counter[str], examples: dict[str, list[dict]], *, rules: tuple[str, ...], all_candidates: bool, settings: dict[str, Any]) -> dict[str, Any]:
    """The report of one filter run from its counters; ``rules`` are the rules that ran, ``settings`` their parameters."""
    datasets: dict[str, dict[str, Any]] = {}
    for key, value in counts.items():
        # dataset/<name>/{in,passed,questions,questions_kept}, dataset/<name>/rule/<rule>, dataset/<name>/lost/<rule>
        parts = key.split("/")
        if parts[0] != "dataset" or len(parts) not in (3, 4):
            continue
        d = datasets.setdefault(parts[1], {"chains": 0, "passed": 0, "questions": 0, "questions_kept": 0, "rules": {}, "lost": {}})
        if len(parts) == 4 and parts[2] in ("rule", "lost"):
            bucket = d["rules" if parts[2] == "rule" else "lost"]
            bucket[parts[3]] = bucket.get(parts[3], 0) + value
        elif parts[2] == "in":
            d["chains"] += value
        elif parts[2] in ("passed", "questions", "questions_kept"):
            d[parts[2]] += value
    for d in datasets.values():
        d["rejected"] = d["chains"] - d["passed"]
        d["kept"] = d["passed"] if all_candidates else d["questions_kept"]
        d["pass_rate"] = d["passed"] / d["chains"] if d["chains"] else None
        d["yield"] = d["questions_kept"] / d["questions"] if d["questions"] else None
        d["questions_lost"] = d["questions"] - d["questions_kept"]
        d["rules"] = dict(sorted(d["rules"].items()))
        d["lost"] = dict(sorted(d["lost"].items()))

    def total(key: str) -> int:
        return sum(d[key] for d in datasets.values())

    chains, passed, questions, questions_kept = total("chains"), total("passed"), total("questions"), total("questions_kept")
    lost: Counter[str] = Counter()
    for d in datasets.values():
        lost.update(d["lost"])
    return {
        "chains": chains,
        "passed": passed,
        "rejected": chains - passed,
        "pass_rate": passed / chains if chains else None,
        "kept": total("kept"),
        "questions": questions,
        "questions_kept": questions_kept,
        "questions_lost": questions - questions_kept,
        "yield": questions_kept / questions if questions else None,
        # per rule: lost questions none of whose candidates passed that rule; "mixed": each rule passed by some
        # candidate, but no candidate passed them all
        "lost": {r: lost.get(r, 0) for r in (*rules, "question", "mixed")},
        "trimmed": counts.get("trimmed", 0),
        "not_selected": counts.get("not_selected", 0),  # chains of questions outside --split, not judged
        "rules": {r: counts.get(f"rule/{r}", 0) for r in (*rules, "question")},
        "reasons": dict(sorted((k.split("/", 1)[1], v) for k, v in counts.items() if k.startswith("reason/"))),
        "datasets": dict(sorted(datasets.items())),
        "examples": {code: examples.get(code, []) for code in sorted(k.split("/", 1)[1] for k in counts if k.startswith("reason/"))},
        "settings": settings,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["# Chain filter report", ""]
    s = report["settings"]
    lines += [
        f"- yield: **{report['questions_kept']}** of **{report['questions']}** questions keep a chain (**{_pct(report['yield'])}**); {report['questions_lost']} lost because no candidate passed",
        f"- candidates judged: **{report['chains']}**, passed **{report['passed']}**, rejected **{report['rejected']}** "
        f"(pass rate **{_pct(report['pass_rate'])}**); chains kept: **{report['kept']}** ({s['keep']})",
        f"- redundant retrievals trimmed from passing chains: {report['trimmed']}",
        f"- rules: {', '.join(s['rules'])}; min recall {s['min_recall']}, redundant = {s['redundant']}, max docids {s['max_docids']}, max chain tokens {s['max_chain_tokens']}",
        "",
        "## Yield per dataset",
        "",
        "| dataset | questions | with a kept chain | yield | candidates | passed | pass rate |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, d in report["datasets"].items():
        lines.append(f"| {name} | {d['questions']} | {d['questions_kept']} | {_pct(d['yield'])} | {d['chains']} | {d['passed']} | {_pct(d['pass_rate'])} |")
    lost = list(report["lost"])
    lines += [
        "",
        "## Questions lost, per rule",
        "",
        "A lost question counts under every rule that none of its candidates passed (so the counts can add up to more "
        "than the questions lost); `mixed`: each rule was passed by some candidate, but no candidate passed them all.",
        "",
        "| dataset | lost | " + " | ".join(lost) + " |",
        "|---|---:|" + "---:|" * len(lost),
    ]
    for name, d in report["datasets"].items():
        lines.append(f"| {name} | {d['questions_lost']} | " + " | ".join(str(d["lost"].get(r, 0)) for r in lost) + " |")
    lines.append(f"| **all** | {report['questions_lost']} | " + " | ".join(str(report["lost"][r]) for r in lost) + " |")
    lines += [
        "",
        "## Candidates failing, per rule",
        "",
        "A rejected candidate counts once under every rule it fails, so the rule counts can add up to more than the rejects.",
        "",
        "| rule | candidates failing | share of judged |",
        "|---|---:|---:|",
    ]
    for rule, n in report["rules"].items():
        lines.append(f"| {rule} | {n} | {_pct(n / report['chains'] if report['chains'] else None)} |")
    lines += ["", "## Failures per reason", "", "| reason | candidates |", "|---|---:|"]
    lines += [f"| `{code}` | {n} |" for code, n in report["reasons"].items()] or ["| (none) | 0 |"]
    rules = list(report["rules"])
    lines += ["", "## Per dataset", "", "| dataset | judged | passed | pass rate | " + " | ".join(rules) + " |", "|---|---:|---:|---:|" + "---:|" * len(rules)]
    for name, d in report["datasets"].items():
        lines.append(f"| {name} | {d['chains']} | {d['passed']} | {_pct(d['pass_rate'])} | " + " | ".join(str(d["rules"].get(r, 0)) for r in rules) + " |")
    lines += ["", "## Examples", ""]
    if not report["examples"]:
        lines.append("No chain was rejected.")
    for code, items in report["examples"].items():
        lines += [f"### `{code}`", ""]
        for e in items:
            text = (e.get("text") or "").replace("\n", " ")
            lines += [f"- qid `{e['qid']}` candidate {e['candidate']}: {e['detail']}", f"  > {text[:400]}{'…' if len(text) > 400 else ''}"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


class FiltersReport(Report, kw_only=True):
    """``filters apply --json``: :func:`build_report`."""

    chains: int
    passed: int
    rejected: int
    pass_rate: float | None
    kept: int
    questions: int
    questions_kept: int
    questions_lost: int
    yield_: float | None = msgspec.field(name="yield")
    lost: dict[str, int]
    trimmed: int
    not_selected: int
    rules: dict[str, int]
    reasons: dict[str, int]
    datasets: dict[str, dict[str, Any]]
    examples: dict[str, list[dict[str, Any]]]
    settings: dict[str, Any]
