"""`grtool report`: the HTML page of a run holds the run's own numbers, section by section, and nothing from outside."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_cli
from report_helpers import SECTION_IDS, build_run, expected_numbers


class Sections(HTMLParser):
    """The text of each <section id=...> (tags dropped, whitespace kept as single spaces)."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, list[str]] = {}
        self.current: str | None = None
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.current = a.get("id")
            self.text[self.current] = []
        if tag == "img":
            self.images.append(a.get("src") or "")

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None

    def handle_data(self, data):
        if self.current:
            self.text[self.current].append(data)

    def section(self, sid: str) -> str:
        return " ".join(" ".join(self.text[sid]).split())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return build_run(tmp_path_factory.mktemp("report"))


def test_the_page_holds_the_runs_numbers_in_stable_sections(run: Path) -> None:
    out = run / "reports" / "report.html"
    run_cli("-q", "report", run)  # the default place
    page = out.read_text()
    parsed = Sections()
    parsed.feed(page)
    assert list(parsed.text) == list(SECTION_IDS)
    want = expected_numbers(run)
    assert want["reasons"] and want["kept"] < want["chained"]  # the run rejected something
    funnel = parsed.section("funnel")
    for step in ("questions", "chained", "kept", "exported"):
        assert re.search(rf"\b{step}\b .*? {want[step]:,}\b", funnel), (step, funnel)
    for name, value in want["recall"].items():
        assert f"recall ({name})" in funnel and f"{value:.4f}" in funnel and f"{value:.4f}" in parsed.section("eval")
    filters = parsed.section("filters")
    for code, n in want["reasons"].items():
        assert f"{code} {n}" in filters
    stages = parsed.section("stages")
    assert f"chains chains chains {want['questions']} {want['chained']}" in stages  # name, output, table, rows in, rows
    for command in want["commands"]:
        assert command in parsed.section("commands")
    assert "first docid" in parsed.section("eval") and "2wikimultihopqa" in parsed.section("corpus")
    assert "distinct triples" in parsed.section("collisions")
    # self-contained: the charts are inline, and nothing points outside the page
    assert len(parsed.images) == 2 and all(src.startswith("data:image/png;base64,") for src in parsed.images)
    assert not re.search(r'(?:src|href)="(?!#|data:)', page) and "http://" not in page and "https://" not in page
    # every value escaped: the rejected chains' docids are text on the page, never tags
    assert "&lt;docid_start&gt;" in page and "<docid_start>" not in page


def test_an_out_inside_a_stage_is_refused(run: Path, tmp_path: Path) -> None:
    proc = run_cli("report", run, "--out", run / "chains" / "report.html", check=2)
    assert f"lies inside {run / 'chains'}, a stage directory grtool wrote" in proc.stderr and not (run / "chains" / "report.html").exists()
    assert "not a directory" in run_cli("report", tmp_path / "nothing", check=2).stderr


def test_commands_are_shell_quoted_and_control_characters_escaped(tmp_path: Path, examples: Path) -> None:
    # before: `--out run[1]` unquoted (a shell globs it) and the ESC of a directory name raw in the page
    import html
    import shlex

    run = tmp_path / "run[1]\x1b[31m"
    run_cli("corpus", "ingest", examples / "musique" / "musique_ans_v1.0_dev.example.jsonl", "--out", run / "corpus")
    run_cli("report", run, "--out", tmp_path / "page.html")
    page = (tmp_path / "page.html").read_text()
    assert "\x1b" not in page
    assert shlex.quote(str(run / "corpus")).replace("\x1b", "\\x1b") in html.unescape(page)
