"""What starting `grtool` costs against its framework's floor: `--help`, `--version` and `status STAGE`.

Each command runs in a child process, `--repeats` times, alternated with the floor (`python -c "import typer,
rich.console"`, what any Typer + Rich program pays before its first line) so that a busy machine slows both alike.
Per command: CPU time (user + sys of the child, from getrusage(RUSAGE_CHILDREN)) and wall time, best and median,
and the ratio of each to the floor's (target <= 1.5x, CPU time: the wall time of a shared machine is noise).

`status` reads a stage directory written before the timings (`corpus ingest` of the bundled HotpotQA example):
its manifest and shard records, JSON, which is what the command has to read; it prints them as Rich tables.

The children write bytecode as an installed grtool has it (PYTHONDONTWRITEBYTECODE is dropped for them) and one
untimed run of each warms the caches.

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
FLOOR = [sys.executable, "-c", "import typer, rich.console"]
TARGET = 1.5


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed runs of each command, alternated with the floor")
    args = ap.parse_args()
    env = child_env()
    grtool = [sys.executable, "-m", "grtool"]
    with tempfile.TemporaryDirectory(prefix="grtool-bench-startup-") as work:
        corpus = Path(work) / "corpus"
        subprocess.run([*grtool, "-q", "corpus", "ingest", str(EXAMPLE), "--out", str(corpus)], env=env, check=True)
        commands = {
            "floor": FLOOR,
            "grtool --help": [*grtool, "--help"],
            "grtool --version": [*grtool, "--version"],
            "grtool status STAGE": [*grtool, "status", str(corpus / "documents")],
        }
        for argv in commands.values():  # bytecode written, files in the page cache
            timed(argv, env)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                times[name].append(timed(argv, env))

    floor_cpu = [cpu for cpu, _ in times["floor"]]
    floor_wall = [wall for _, wall in times["floor"]]
    print(f"{args.repeats} runs each, alternated; floor: {' '.join(FLOOR[1:])!r}; target <= {TARGET}x of its CPU time")
    print(f"{'command':<22} {'CPU best':>9} {'median':>8} {'ratio':>6} {'median':>7} | {'wall best':>9} {'median':>8} {'ratio':>6} {'median':>7}")
    for name, runs in times.items():
        cpu, wall = [c for c, _ in runs], [w for _, w in runs]
        print(f"{name:<22} {min(cpu):>8.3f}s {statistics.median(cpu):>7.3f}s "
              f"{min(cpu) / min(floor_cpu):>5.2f}x {statistics.median(cpu) / statistics.median(floor_cpu):>6.2f}x | "
              f"{min(wall):>8.3f}s {statistics.median(wall):>7.3f}s "
              f"{min(wall) / min(floor_wall):>5.2f}x {statistics.median(wall) / statistics.median(floor_wall):>6.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
