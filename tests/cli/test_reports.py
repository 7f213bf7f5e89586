"""Every command that writes and prints a ``--json`` report declares its type (``Command(report="module:Name")``, a
:class:`grtool.records.Report`), and prints it only as converted through that declaration
(:func:`grtool.cli.options.print_report`). Every test that runs such a command with ``--json`` so checks the report
against its declaration: a field it lacks, or a value of another type, fails the run."""

from __future__ import annotations

import msgspec
import pytest

from grtool.cli.commands import declared
from grtool.cli.stage_options import parameters
from grtool.records import Report

# Commands whose --json shows what is already there, in views of their own (no report of a run): rows, a stage's
# status, validate's verdicts, an index lookup, a pipeline's stage records.
SHOWN = {"show", "status", "validate", "index query", "pipeline status"}

PRINTING = sorted(words for words, command in declared().items() if any(p.name == "as_json" for p in parameters(command)))


def test_the_commands_that_print_json_are_found():
    assert {"filters apply", "corpus ingest", "index build", "train sft", "eval recall"} <= set(PRINTING)


@pytest.mark.parametrize("words", [w for w in PRINTING if w not in SHOWN])
def test_every_command_printing_a_report_declares_its_type(words):
    kind = declared()[words].report_type()
    assert kind is not None, f"{words} prints --json and declares no report type"
    assert issubclass(kind, Report) and kind.__struct_config__.forbid_unknown_fields, kind
    assert kind.__module__.split(".")[1] != "cli", f"{words}: its report is declared in its stage's package, not the CLI"


def test_a_report_is_printed_only_as_its_declaration_says(capsys):
    from grtool.cli.options import print_report
    from grtool.export.gmr import GmrReport

    fields = {"questions": 2, "retrieval_pairs": 7, "no_gold": 0, "missing_gold_document": 0, "missing_examples": [], "memorization_pairs": 0,
              "too_short": 0, "outside_split": 0}  # fmt: skip
    print_report(dict(reversed(fields.items())), kind=GmrReport)  # printed in the declaration's order
    assert capsys.readouterr().out.strip() == msgspec.json.encode(fields).decode()
    with pytest.raises(RuntimeError, match=r"does not match its declaration grtool.export.gmr.GmrReport: Object contains unknown field `extra`"):
        print_report({**fields, "extra": 1}, kind=GmrReport)
    with pytest.raises(RuntimeError, match=r"Expected `int`, got `str` - at `\$.questions`"):
        print_report({**fields, "questions": "two"}, kind=GmrReport)
