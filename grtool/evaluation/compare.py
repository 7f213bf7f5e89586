"""`grtool eval compare`: recall of several runs side by side (the demo's base few-shot / SFT / KTO table).

Inputs are the JSON reports `grtool eval recall --json` writes, each with a label; the output is a Markdown
table (recall per dataset and overall, one column per run) and, optionally, a grouped bar chart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from grtool.errors import InputError


def load_runs(specs: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``LABEL=REPORT.json`` (or a bare path, labelled by its file stem) → (label, report)."""
    runs = []
    for spec in specs:
        label, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        p = Path(path)
        try:
            report = orjson.loads(p.read_bytes())
        except OSError as e:
            raise InputError(f"{p}: cannot read ({e.strerror})") from None
        except orjson.JSONDecodeError as e:
            raise InputError(f"{p}: not a JSON report of `grtool eval recall --json` ({e})") from None
        if not isinstance(report, dict) or "recall" not in report or "per_dataset" not in report:
            raise InputError(f"{p}: not a JSON report of `grtool eval recall --json` (no recall / per_dataset)")
        runs.append((label or p.stem, report))
    if not runs:
        raise InputError("name at least one recall report")
    return runs


def table(runs: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """dataset (and "all") → label → recall."""
    datasets = sorted({d for _, r in runs for d in r["per_dataset"]})
    rows: dict[str, dict[str, float | None]] = {}
    for name in [*datasets, "all"]:
        rows[name] = {}
        for label, report in runs:
            entry = report if name == "all" else report["per_dataset"].get(name)
            rows[name][label] = entry.get("recall") if entry else None
    return rows


def markdown(runs: list[tuple[str, dict[str, Any]]], title: str = "Retrieval recall") -> str:
    rows = table(runs)
    labels = [label for label, _ in runs]
    lines = [f"# {title}", "", "| dataset | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, values in rows.items():
        cells = ["-" if values[label] is None else f"{values[label]:.4f}" for label in labels]
        lines.append(f"| {'**all**' if name == 'all' else name} | " + " | ".join(cells) + " |")
    lines += ["", "Responses scored: " + ", ".join(f"{label} {report['responses']}" for label, report in runs) + "."]
    lines += ["Hallucinated docids: " + ", ".join(f"{label} {report['hallucinated']}/{report['docids']}" for label, report in runs) + "."]
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, dict[str, Any]]], path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table(runs)
    names = list(rows)
    labels = [label for label, _ in runs]
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
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
