"""`grtool report` in a real browser: Debian's chromium driven by Playwright (``executable_path``: Playwright's own
browser downloads are not used). The page loads from a file without console errors, asks for nothing outside itself,
shows its charts, and its sections hold the run's numbers.

Skipped where chromium or Playwright is missing, except in CI (``CI=true``), where .ci/run installs both and a
missing one fails the test.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from report_helpers import SECTION_IDS, build_run, expected_numbers


def _browser() -> str:
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install grtool[test])")
    chromium = shutil.which("chromium")
    if chromium is None:
        missing.append("chromium (apt-get install chromium)")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser test; missing: {', '.join(missing)}")
        pytest.skip(f"no browser test without {', '.join(missing)}")
    return chromium


@pytest.fixture(scope="module")
def page_file(tmp_path_factory) -> tuple[Path, Path]:
    _browser()
    run = build_run(tmp_path_factory.mktemp("browser"))
    out = run.parent / "report.html"
    run_cli("-q", "report", run, "--out", out)
    return run, out


def test_the_report_opens_in_chromium_without_errors_and_shows_the_run(page_file) -> None:
    from playwright.sync_api import sync_playwright

    run, out = page_file
    errors: list[str] = []
    outside: list[str] = []
    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start
        browser = p.chromium.launch(executable_path=_browser(), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(("file://", "data:")) else None)
            page.goto(out.as_uri(), wait_until="load")
            assert page.title().startswith("grtool report")
            assert [page.get_attribute(f"section:nth-of-type({i + 1})", "id") for i in range(len(SECTION_IDS))] == list(SECTION_IDS)
            text = {sid: " ".join(page.inner_text(f"#{sid}").split()) for sid in SECTION_IDS}
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        finally:
            browser.close()
    assert errors == [] and outside == []
    assert len(widths) == 2 and all(w > 100 for w in widths)  # the stats and recall charts decoded
    want = expected_numbers(run)
    for step in ("questions", "chained", "kept", "exported"):
        assert f"{step}" in text["funnel"] and f"{want[step]:,}" in text["funnel"]
    for name, value in want["recall"].items():
        assert f"recall ({name})" in text["funnel"] and f"{value:.4f}" in text["eval"]
    for code, n in want["reasons"].items():
        assert f"{code} {n}" in text["filters"]
    assert all(command in text["commands"] for command in want["commands"])
