"""What a log written without a terminal must look like (Slurm, CI): shared by the tests that read stderr."""

from __future__ import annotations

import re

STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")
# The parts of a progress line that move with the clock alone: durations and rates.
_CLOCK = re.compile(r"\d+:\d\d:\d\d|[\d.,]+(?: \w+)?/s")


def unstamped(text: str) -> list[str]:
    """The lines of ``text`` without their leading timestamp."""
    return [STAMP.sub("", line) for line in text.splitlines()]


def check_log(text: str, progress: tuple[str, ...] = ()) -> list[str]:
    """Assert the log rules on stderr ``text`` and return its lines without timestamps: every non-empty line starts
    with a timestamp, no carriage return (a progress bar's frames), no padding at line ends, and no progress line
    of the ``progress`` tasks that repeats the one before it unless it says ``still`` (a heartbeat)."""
    assert "\r" not in text, f"carriage returns (a progress bar's frames) in:\n{text[-3000:]}"
    lines = text.splitlines()
    for line in lines:
        assert not line or STAMP.match(line), f"a line without a timestamp: {line!r}\nin:\n{text[-3000:]}"
        assert line == line.rstrip(), f"a padded line: {line!r}"
    plain = unstamped(text)
    shown = [_CLOCK.sub("T", line) for line in plain if line.startswith(tuple(f"{p}: " for p in progress))]
    for before, after in zip(shown, shown[1:]):
        assert before != after or "; still " in after, f"a progress line repeated without news: {after!r}\nin:\n{text[-3000:]}"
    return plain
