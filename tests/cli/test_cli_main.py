"""Exit codes of the `grtool` command: usage errors are 2 with a one-line reason, never a traceback."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    "args, says",
    [
        (["corpus", "ingest"], "Missing argument"),
        (["corpus", "ingest", "x.json", "--out", "o", "--bogus"], "No such option"),
        (["corpus", "ingest", "x.json", "--out", "o", "--dataset", "nope"], "Invalid value for '--dataset'"),
        (["no-such-command"], "No such command"),
    ],
)
def test_usage_errors_exit_2(cli, args, says):
    proc = cli(*args, check=2)
    assert says in proc.stderr
    assert "Traceback" not in proc.stderr


def test_version_and_help(cli):
    assert cli("--version").stdout.startswith("grtool ")
    assert "Example" in cli("corpus", "ingest", "--help").stdout


def test_quiet_keeps_stderr_free_of_summaries(cli, examples, tmp_path):
    loud = cli("corpus", "ingest", examples / "musique", "--out", tmp_path / "a")
    assert "questions" in loud.stderr
    quiet = cli("-q", "corpus", "ingest", examples / "musique", "--out", tmp_path / "b")
    assert quiet.stderr.strip() == "" and quiet.stdout == ""
