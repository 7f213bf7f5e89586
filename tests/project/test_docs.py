"""The documentation cannot drift from the CLI: every `grtool …` line in a shell block of the README, docs/ and
examples/ names a command and options that exist, and the docs site builds with `mkdocs build --strict` (a broken
link or a page left out of the nav fails)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grtool.cli.reference import check_command_line, render_markdown, root_command

from docs_helpers import DOCS, REPO, grtool_lines, pipeline_files


def _documented() -> list[tuple[str, str]]:
    return [(str(path.relative_to(REPO)), line) for path in DOCS for line in grtool_lines(path.read_text(encoding="utf-8"))]


def test_the_docs_hold_grtool_commands():
    assert len(_documented()) > 20


def test_every_documented_grtool_command_exists_with_its_options():
    root = root_command()
    problems = [f"{where}: {problem}" for where, line in _documented() if (problem := check_command_line(line, root))]
    assert not problems, "\n".join(problems)


def test_a_renamed_option_is_caught():
    root = root_command()
    assert check_command_line("grtool corpus ingest data --out out/x", root) is None
    assert "has no option --outt" in check_command_line("grtool corpus ingest data --outt out/x", root)
    assert "no command `grtool corpus ingestt`" in check_command_line("grtool corpus ingestt data", root)


def test_the_reference_covers_every_command():
    text = render_markdown()
    for words, _ in __import__("grtool.cli.reference", fromlist=["commands"]).commands():
        assert f"## grtool {' '.join(words)}" in text


def test_the_committed_command_reference_is_what_the_cli_makes():
    """docs/reference/cli.md is generated from the CLI and committed: a command or an option changed without
    regenerating it fails here."""
    from grtool.cli.reference import REGENERATE, render_page

    committed = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert committed == render_page(), f"docs/reference/cli.md is not what the CLI makes now: regenerate it with `{REGENERATE}`"


def test_the_docs_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed in CI (the test extra brings it: pip install '.[test]')")
        pytest.skip("mkdocs is not installed (pip install '.[docs]')")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "grtool corpus ingest" in reference and "--rows-per-part" in reference


def test_every_documented_pipeline_file_loads_and_runs_existing_commands(tmp_path):
    """A pipeline file in examples/ or the docs is valid (keys, types, placeholders) and each stage's command line,
    as the pipeline would run it, names a command and options that exist."""
    from grtool.pipeline.config import load_pipeline

    root = root_command()
    files = pipeline_files(tmp_path)
    assert any(where.startswith("docs/") for where, _ in files) and any(where.endswith("laptop.toml") for where, _ in files)
    problems = []
    for where, path in files:
        pipeline = load_pipeline(path)
        problems += [f"{where}: stage {stage.name}: {problem}" for stage in pipeline.stages if (problem := check_command_line(shlex.join(["grtool", *stage.argv()]), root))]
    assert not problems, "\n".join(problems)


def test_a_pipeline_option_renamed_in_the_cli_is_caught(tmp_path):
    from grtool.pipeline.config import load_pipeline

    bad = tmp_path / "bad.toml"
    bad.write_text('out = "out/x"\n[[stages]]\nname = "a"\nrun = "corpus ingest"\nargs = ["d"]\noptions = { out = "{out}/c", rows_per_partt = 5 }\n')
    stage = load_pipeline(bad).stages[0]
    assert "has no option --rows-per-partt" in check_command_line(shlex.join(["grtool", *stage.argv()]), root_command())


def test_links_of_the_readme_and_examples_point_to_files_that_exist():
    """The README and examples/ are outside the site, so mkdocs does not check their links: a docs page renamed
    or removed would leave them dangling."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    pages = [REPO / "README.md", *sorted((REPO / "examples").rglob("*.md"))]
    broken = [f"{page.relative_to(REPO)}: {target}" for page in pages for target in link.findall(page.read_text(encoding="utf-8")) if "://" not in target and not (page.parent / target).exists()]
    assert not broken, "\n".join(broken)
    assert any("docs/guides/" in target for target in link.findall((REPO / "README.md").read_text(encoding="utf-8")))
