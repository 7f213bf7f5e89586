"""The empty-output guard every generating stage shares (``--max-empty-share``).

A model or server that answers nothing usable (empty strings, refusals, a broken chat template) must not give
a clean exit: per output part, the stage counts its units (documents for `triples extract`, candidate chains for
`chains synthesize`) and those that came out empty. When a part's empty share exceeds ``--max-empty-share``
the part is still finished (its rows, rejects and counters committed, so a fixed re-run resumes or re-parses
from the request cache), no further part is started, and the command exits 1 naming the part, the share and a
few examples. A part finished by an earlier run is judged again from its recorded counters, so re-running
after the guard tripped does not exit 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grtool.errors import GuardTripped

EXAMPLE_CHARS = 300
MAX_EXAMPLES = 3  # empty units quoted in the guard's message
DEFAULT_MAX_EMPTY_SHARE = 0.2


def example(key: str | None, why: str | None, finish_reason: str | None, text: str) -> str:
    """One example for the guard's message: what was asked, why it counts as empty, what came back."""
    snippet = (text or "")[:EXAMPLE_CHARS].replace("\n", " ")
    return f"{key} ({why}, finish_reason={finish_reason}): {snippet!r}"


@dataclass
class EmptyOutputs:
    """One part's count of units and of empty ones, with a few examples of the empty ones."""

    part: str
    total: int = 0
    empty: int = 0
    examples: list[str] = field(default_factory=list)
    resumed: bool = False  # finished by an earlier run: the counts come from its shard record

    def add(self, n: int = 1) -> None:
        self.total += n

    def add_empty(self, example_text: str | None = None) -> None:
        """One more empty unit (already counted by :meth:`add`); ``example_text`` from :func:`example`."""
        self.empty += 1
        if example_text is not None and len(self.examples) < MAX_EXAMPLES:
            self.examples.append(example_text)

    @property
    def wants_examples(self) -> bool:
        return len(self.examples) < MAX_EXAMPLES

    def over(self, max_empty_share: float) -> bool:
        """Too large a share of this part's units came out empty."""
        return bool(self.total) and self.empty / self.total > max_empty_share

    def error(self, max_empty_share: float, *, units: str, outcome: str, where: str = "", redo: str = "") -> GuardTripped:
        """The guard's exit-1 error: ``"<part>: E of N <units> <outcome> (S% > --max-empty-share X)<where>; e.g. …"``.

        ``where`` points at the kept evidence (rejects file, rows); ``redo`` says what ``--overwrite`` would do,
        shown when the part was finished by an earlier run.
        """
        earlier = f"; this part was finished by an earlier run (--overwrite redoes it{', ' + redo if redo else ''})" if self.resumed else ""
        return GuardTripped(
            f"{self.part}: {self.empty} of {self.total} {units} {outcome} "
            f"({self.empty / self.total:.0%} > --max-empty-share {max_empty_share}){where}{earlier}" + ("; e.g. " + " | ".join(self.examples) if self.examples else ""),
            guard="--max-empty-share",
            numbers={"part": self.part, "units": units, "empty": self.empty, "total": self.total, "share": round(self.empty / self.total, 4), "max_empty_share": max_empty_share},
        )
