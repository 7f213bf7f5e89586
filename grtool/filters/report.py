"""The filter report: counts per rule, per reason and per dataset, pass rate, two examples per failure."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grtool.filters.apply import FilterConfig


def build_report(counts: Counter[str], examples: dict[str, list[dict]], config: "FilterConfig") -> dict[str, Any]:
    datasets: dict[str, dict[str, Any]] = {}
    for key, value in counts.items():
        parts = key.split("/")  # dataset/<name>/in, dataset/<name>/kept, dataset/<name>/rule/<rule>
        if parts[0] != "dataset" or len(parts) not in (3, 4):
            continue
        d = datasets.setdefault(parts[1], {"chains": 0, "kept": 0, "rules": {}})
        if len(parts) == 4:
            d["rules"][parts[3]] = d["rules"].get(parts[3], 0) + value
        elif parts[2] == "in":
            d["chains"] += value
        elif parts[2] == "kept":
            d["kept"] += value
    for d in datasets.values():
        d["rejected"] = d["chains"] - d["kept"]
        d["pass_rate"] = d["kept"] / d["chains"] if d["chains"] else None
        d["rules"] = dict(sorted(d["rules"].items()))
    total = sum(d["chains"] for d in datasets.values())
    kept = sum(d["kept"] for d in datasets.values())
    return {
        "chains": total,
        "kept": kept,
        "rejected": total - kept,
        "pass_rate": kept / total if total else None,
        "trimmed": counts.get("trimmed", 0),
        "not_selected": counts.get("not_selected", 0),
        "rules": {r: counts.get(f"rule/{r}", 0) for r in (*config.rules, "question")},
        "reasons": dict(sorted((k.split("/", 1)[1], v) for k, v in counts.items() if k.startswith("reason/"))),
        "datasets": dict(sorted(datasets.items())),
        "examples": {code: examples.get(code, []) for code in sorted(k.split("/", 1)[1] for k in counts if k.startswith("reason/"))},
        "settings": config.params(),
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def render_markdown(report: dict[str, Any]) -> str:
    lines = ["# Chain filter report", ""]
    s = report["settings"]
    lines += [
        f"- chains judged: **{report['chains']}**, kept **{report['kept']}**, rejected **{report['rejected']}** "
        f"(pass rate **{_pct(report['pass_rate'])}**)",
        f"- redundant retrievals trimmed from kept chains: {report['trimmed']}",
        f"- candidates not judged (not the selected one; `--all-candidates` judges them): {report['not_selected']}",
        f"- rules: {', '.join(s['rules'])}; min recall {s['min_recall']}, redundant = {s['redundant']}, "
        f"max docids {s['max_docids']}, max chain tokens {s['max_chain_tokens']}",
        "",
        "A rejected chain counts once under every rule it fails, so the rule counts can add up to more than the rejects.",
        "",
        "## Failures per rule",
        "",
        "| rule | chains failing | share of judged |",
        "|---|---:|---:|",
    ]
    for rule, n in report["rules"].items():
        lines.append(f"| {rule} | {n} | {_pct(n / report['chains'] if report['chains'] else None)} |")
    lines += ["", "## Failures per reason", "", "| reason | chains |", "|---|---:|"]
    lines += [f"| `{code}` | {n} |" for code, n in report["reasons"].items()] or ["| (none) | 0 |"]
    rules = list(report["rules"])
    lines += ["", "## Per dataset", "", "| dataset | judged | kept | pass rate | " + " | ".join(rules) + " |", "|---|---:|---:|---:|" + "---:|" * len(rules)]
    for name, d in report["datasets"].items():
        lines.append(f"| {name} | {d['chains']} | {d['kept']} | {_pct(d['pass_rate'])} | " + " | ".join(str(d["rules"].get(r, 0)) for r in rules) + " |")
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
