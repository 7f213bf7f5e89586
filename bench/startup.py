"""What starting `grtool` costs against its framework's floor: `--help`, `--version` and `status STAGE`.

Each command runs in a child process, `--repeats` times, alternated with the floors so that a busy machine slows
all alike. Per command: CPU time (user + sys of the child, from getrusage(RUSAGE_CHILDREN)) and wall time, best
and median, and the ratio of the CPU times to two floors (target <= 1.5x; the wall time of a shared machine is
noise):

- `import`: `python -c "import typer, rich.console"`, what any Typer + Rich program pays before its first line;
- `typer app`: a minimal Typer app (one group, two commands) doing the same thing: printing its `--help`, or
  running a command that takes a directory and prints a Rich table of its `_manifest.json`. A plain Typer program
  loads Typer's whole help renderer (rich.markdown, rich.traceback) to draw help and pydantic to convert a
  command's values; grtool loads neither (grtool/cli/shape.py, grtool/cli/typed.py).

`status` reads a stage directory written before the timings (`corpus ingest` of the bundled HotpotQA example):
its manifest and shard records (JSON, what the command has to read) and the size of each part.

The children write bytecode as an installed grtool has it (PYTHONDONTWRITEBYTECODE is dropped for them) and one
untimed run of each warms the caches. They run in this checkout's directory: `python -m grtool` imports grtool
from the current directory before PYTHONPATH, so a bench started from another checkout would time that one.

    python bench/startup.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "data" / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"
TARGET = 1.5

TYPER_APP = """
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="A minimal Typer app.")
group = typer.Typer(help="A group of commands.")
app.add_typer(group, name="group")


@group.command()
def one(path: Annotated[Path, typer.Argument(help="A file.")], count: Annotated[int, typer.Option(help="How many.")] = 1) -> None:
    \"\"\"A command of the group.\"\"\"


@app.command()
def status(directory: Annotated[Path, typer.Argument(help="A stage directory.")],
           as_json: Annotated[bool, typer.Option("--json", help="JSON.")] = False) -> None:
    \"\"\"The directory's manifest as a table.\"\"\"
    manifest = json.loads((directory / "_manifest.json").read_text())
    table = Table(title="status")
    for key in ("table", "num_parts"):
        table.add_column(key)
    table.add_row(str(manifest.get("table")), str(manifest.get("num_parts")))
    Console(stderr=True).print(table)


app()
"""


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed runs of each command, alternated with the floors")
    args = ap.parse_args()
    env = child_env()
    grtool = [sys.executable, "-m", "grtool"]
    with tempfile.TemporaryDirectory(prefix="grtool-bench-startup-") as work:
        corpus, typer_app = Path(work) / "corpus", Path(work) / "typer_app.py"
        subprocess.run([*grtool, "-q", "corpus", "ingest", str(EXAMPLE), "--out", str(corpus)], env=env, cwd=REPO, check=True)
        typer_app.write_text(TYPER_APP)
        stage = str(corpus / "documents")
        # name: (command line, the Typer app's floor for the same work)
        commands = {
            "import floor": [sys.executable, "-c", "import typer, rich.console"],
            "typer app --help": [sys.executable, str(typer_app), "--help"],
            "typer app status DIR": [sys.executable, str(typer_app), "status", stage],
            "grtool --help": [*grtool, "--help"],
            "grtool --version": [*grtool, "--version"],
            "grtool status STAGE": [*grtool, "status", stage],
        }
        app_floor = {"grtool --help": "typer app --help", "grtool status STAGE": "typer app status DIR"}
        for argv in commands.values():  # bytecode written, files in the page cache
            timed(argv, env)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                times[name].append(timed(argv, env))

    def cpu(name: str, pick) -> float:
        return pick([c for c, _ in times[name]])

    print(f"{args.repeats} runs each, alternated; CPU time ratios (best, median) to the import floor and to the Typer app doing the same; target <= {TARGET}x")
    print(f"{'command':<22} {'CPU best':>9} {'median':>8} | {'wall best':>9} {'median':>8} | {'/ import floor':>15} | {'/ typer app':>12}")
    for name in commands:
        wall = [w for _, w in times[name]]
        ratios = [f"{cpu(name, p) / cpu('import floor', p):.2f}x" for p in (min, statistics.median)]
        floor = app_floor.get(name)
        app = [f"{cpu(name, p) / cpu(floor, p):.2f}x" for p in (min, statistics.median)] if floor else ["", ""]
        print(f"{name:<22} {cpu(name, min):>8.3f}s {cpu(name, statistics.median):>7.3f}s | {min(wall):>8.3f}s "
              f"{statistics.median(wall):>7.3f}s | {ratios[0]:>7} {ratios[1]:>7} | {app[0]:>6} {app[1]:>5}")  # fmt: skip


if __name__ == "__main__":
    main()
