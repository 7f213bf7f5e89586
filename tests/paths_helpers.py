"""Where the tests find the repository and its files, whichever folder of tests/ a test module sits in.

Every path a test builds from the repository starts here (conftest.py re-exports these), never from its own
``__file__``, so a test file can move between the folders of tests/ without changing what it reads."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
EXAMPLES = REPO / "examples" / "data"
# Our own records in the release layouts for shapes the examples lack (more questions of one dataset).
TEST_DATA = TESTS / "data"
BENCH = REPO / "bench"
