"""The shell blocks and pipeline files of the README, docs/ and examples/, for the tests that hold the docs to the CLI
(test_docs.py) and to the recipe's rules (test_recipe_splits.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from paths_helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)


def grtool_lines(text: str) -> list[str]:
    """The grtool command lines of the text's shell blocks: continuation lines joined, each command of a line
    split at `&&`, `||`, `|` and `;`, environment assignments and `$ ` prompts dropped."""
    found = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token and set(token) <= set("|&;"):
                    while command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", command[0]):
                        command.pop(0)
                    if command and command[0].endswith("grtool") and "(" not in command[0]:
                        found.append(shlex.join(command))
                    command = []
                else:
                    command.append(token)
    return found


TOML_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.S | re.M)


def pipeline_files(tmp_path: Path) -> list[tuple[str, Path]]:
    """The example pipeline files, and every ```toml block of the docs that is a whole pipeline file (it has
    stages; a block showing one table is a fragment) written to a file of its own."""
    files = [(str(p.relative_to(REPO)), p) for p in sorted((REPO / "examples").rglob("*.toml"))]
    for path in DOCS:
        for n, block in enumerate(TOML_BLOCK.findall(path.read_text(encoding="utf-8"))):
            if "[[stages]]" not in block:
                continue
            target = tmp_path / f"{path.stem}-{n}.toml"
            target.write_text(block, encoding="utf-8")
            files.append((f"{path.relative_to(REPO)} (toml block {n + 1})", target))
    return files
