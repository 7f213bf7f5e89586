"""A stand-in Slurm for the Slurm executor's safety tests: ``sbatch``, ``scontrol`` and ``srun`` programs put first
on PATH.

- ``sbatch`` reads a script's ``#SBATCH`` lines the way Slurm does (whitespace splits words, quotes group them,
  a backslash escapes the next character, an unquoted ``#`` starts a comment, the first line that is not a
  comment ends the directives), records its arguments and the parsed directives in ``sbatch.jsonl``, and then
  *executes* the script, once per array task, the way a node would: a value that escaped its quoting runs.
  It answers ``FAKE_SBATCH_ANSWER`` when set, else a new job id.
- ``scontrol show config`` prints ``MaxArraySize = $FAKE_MAX_ARRAY_SIZE`` when set (else it fails, as with no
  controller); ``scontrol show job`` knows no job; each call is recorded in ``scontrol.jsonl``.
- ``srun``, ``grtool`` (the finalize step inside a script) and ``scancel`` record their arguments in
  ``srun.jsonl`` / ``grtool.jsonl`` / ``scancel.jsonl`` and exit 0.
- ``FAKE_SBATCH_BAD_AT=N``: the Nth submission answers an error text instead of a job id.
- ``FAKE_CONTROLLER_DOWN=1``: every ``scontrol`` call answers that it cannot contact the controller.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SBATCH = r'''
import json, os, re, subprocess, sys
from pathlib import Path

HERE = Path(os.environ["FAKE_SLURM_DIR"])

def argument(line):
    """Slurm's own rule for one #SBATCH line (src/sbatch/opt.c): its words."""
    words, word, quote, escape, started = [], "", None, False, False
    for ch in line:
        if escape:
            word += ch; escape = False; started = True
        elif ch == "\\":
            escape = True
        elif quote:
            if ch == quote:
                quote = None
            else:
                word += ch
        elif ch in "\"'":
            quote = ch; started = True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append(word)
            word, started = "", False
        else:
            word += ch; started = True
    if started:
        words.append(word)
    return words

def directives(script):
    found = []
    for line in script.split("\n")[1:]:
        if line.startswith("#SBATCH"):
            found += argument(line[len("#SBATCH"):])
        elif line.strip() and not line.startswith("#"):
            break
    return found

args = sys.argv[1:]
test_only = "--test-only" in args
script_path = None if test_only else args[-1]
script = sys.stdin.read() if test_only else Path(script_path).read_text()
said = directives(script)
count = HERE / "count"
n = int(count.read_text()) + 1 if count.exists() else 100
answer = os.environ.get("FAKE_SBATCH_ANSWER", str(n))
if not test_only and os.environ.get("FAKE_SBATCH_BAD_AT") == str(n - 99):  # the Nth submission answers nonsense
    answer = "sbatch: error: try again"
with open(HERE / "sbatch.jsonl", "a") as f:
    f.write(json.dumps({"args": args, "directives": said, "test_only": test_only, "answer": None if test_only else answer}) + "\n")
if test_only:
    print(f"sbatch: Job {n} to start at now", file=sys.stderr)
    sys.exit(0)
count.write_text(str(n))
array = next((d.split("=", 1)[1] for d in said if d.startswith("--array=")), None)
chdir = next((d.split("=", 1)[1] for d in said if d.startswith("--chdir=")), os.getcwd())
tasks = [None]
if array:
    m = re.fullmatch(r"(\d+)-(\d+)(?:%\d+)?", array)
    tasks = list(range(int(m[1]), int(m[2]) + 1))
for task in tasks:
    env = {**os.environ, "SLURM_JOB_ID": str(n)}
    if task is not None:
        env.update(SLURM_ARRAY_JOB_ID=str(n), SLURM_ARRAY_TASK_ID=str(task))
    subprocess.run(["bash", script_path], env=env, cwd=chdir)
print(answer)
'''

RECORDER = r"""
import json, os, sys
from pathlib import Path
with open(Path(os.environ["FAKE_SLURM_DIR"]) / "{name}.jsonl", "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "task": os.environ.get("SLURM_ARRAY_TASK_ID")}}) + "\n")
"""

SCONTROL_ANSWERS = r"""
if sys.argv[1:3] == ["show", "config"] and os.environ.get("FAKE_MAX_ARRAY_SIZE"):
    print("Configuration data as of now")
    print("JobCompType             = jobcomp/none")
    print(f"MaxArraySize            = {os.environ['FAKE_MAX_ARRAY_SIZE']}")
    sys.exit(0)
if os.environ.get("FAKE_CONTROLLER_DOWN"):  # what scontrol says once it has waited out its timeout
    print("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
    sys.exit(1)
if sys.argv[1:3] == ["show", "job"]:  # what Slurm answers for a job it does not know
    print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
    sys.exit(1)
print("slurm_load_ctl_conf error: Unable to contact slurm controller", file=sys.stderr)
sys.exit(1)
"""

SCONTROL = RECORDER.format(name="scontrol") + SCONTROL_ANSWERS


def install(folder: Path, *, max_array_size: int | None = None, answer: str | None = None, bad_at: int | None = None) -> dict[str, str]:
    """Write the fake programs into ``folder``/bin; the environment that puts them first on PATH."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    programs = {"sbatch": SBATCH, "scontrol": SCONTROL, **{name: RECORDER.format(name=name) for name in ("srun", "grtool", "scancel")}}
    for name, text in programs.items():
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n{text}")
        path.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_SLURM_DIR": str(folder)}
    if max_array_size is not None:
        env["FAKE_MAX_ARRAY_SIZE"] = str(max_array_size)
    if answer is not None:
        env["FAKE_SBATCH_ANSWER"] = answer
    if bad_at is not None:
        env["FAKE_SBATCH_BAD_AT"] = str(bad_at)
    return env


def records(folder: Path, name: str) -> list[dict]:
    path = folder / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# What the Slurm client of a machine without a reachable controller answers (this is what CI's machine has: the
# client installed, no slurmctld), said at once instead of after Slurm's message timeout (9 to 18 s a call there).
NO_CONTROLLER = {
    "scontrol": "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "squeue": "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "sinfo": "slurm_load_partitions: Unable to contact slurm controller (connect failure)",
    "sbatch": "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
    "scancel": "scancel: error: Kill job error on job id 0: Unable to contact slurm controller (connect failure)",
    "srun": "srun: error: Unable to allocate resources: Unable to contact slurm controller (connect failure)",
}


def install_client_without_controller(folder: Path) -> Path:
    """Shell programs for the Slurm client, each answering as with no controller (exit 1); the folder to put first
    on PATH, so that no test but the real-cluster ones reaches the machine's own Slurm."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, message in NO_CONTROLLER.items():
        if name == "scontrol":  # `scontrol show config` words its failure after the call it made
            body = f"""case "$1 $2" in "show config") echo 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2 ;;
  *) echo '{message}' >&2 ;; esac"""
        else:
            body = f"echo '{message}' >&2"
        path = folder / name
        path.write_text(f"#!/bin/sh\n{body}\nexit 1\n")
        path.chmod(0o755)
    return folder
