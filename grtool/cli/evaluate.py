"""`grtool eval` commands."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, TableInput, TableOutput, register
from grtool.cli.llm_options import LLMSettings, llm_options
from grtool.models import DEFAULT_MODEL_NAME
from grtool.cli.options import Json, NumShards, Overwrite, Plot, ShardIndex, MaxEmptyShare, plot_extras, print_report
from grtool.errors import DataProblem

register(Group("eval", "Score model responses (retrieval recall, answer accuracy)."))


def _answer_extras(options):
    from grtool.cli.llm_options import backend_extras

    return backend_extras(options) if options.get("answers") is None else []


class Layout(str, Enum):
    default = "default"
    paper = "paper"


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def recall_cmd(
    responses: Annotated[
        Optional[Path], typer.Argument(help='A `grtool retrieve` output directory, or JSON Lines of {"qid": ..., "response": ...}; several lines per qid = samples ("-" = stdin). Not with --run.')
    ] = None,
    corpus: Annotated[Path, typer.Option("--corpus", help="Corpus run directory (holding questions/), or its questions stage.")] = ...,  # type: ignore[assignment]
    triples: Annotated[
        Optional[Path], typer.Option("--triples", help="Triples stage directory (or a run directory holding triples/); needed for responses that name docids, not for --method bm25, gmr or --run.")
    ] = None,
    run: Annotated[
        Optional[Path], typer.Option("--run", help="A TREC run file of another retriever (qid Q0 doc rank score tag; doc = a grtool doc id or a title) to score instead of RESPONSES.")
    ] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", min=1, help="--run: documents per question scored (default: |gold| + 1, the paper's protocol for one-shot retrievers).")] = None,
    trec_run: Annotated[
        Optional[Path], typer.Option("--trec-run", metavar="FILE", help="Also write the first response of every scored question as a TREC run (for ranx, trec_eval, pytrec_eval).")
    ] = None,
    trec_qrels: Annotated[Optional[Path], typer.Option("--trec-qrels", metavar="FILE", help="Also write the gold documents of the scored questions as TREC qrels.")] = None,
    allow_train_overlap: Annotated[bool, typer.Option("--allow-train-overlap", help="Score questions the checkpoint that wrote the responses trained on (default: exit 1 naming them).")] = False,
    as_json: Json = False,
    per_question: Annotated[
        bool,
        typer.Option(
            "--per-question",
            help="Also every question: its recall, exact set, docids with their verdicts (gold / non-gold / hallucinated) and the titles of what it retrieved; with --json, the report's `questions` list.",
        ),
    ] = False,
) -> None:
    """Retrieval recall of model responses: |retrieved ∩ gold| / |gold| per response.

    Docids are read in special-token form or in square brackets. A triple held by several documents retrieves all of them; a docid written tail-first counts; a docid found nowhere is a hallucination; broken or empty markers are counted as malformed. Responses that name documents (`retrieve --method bm25`, `--mode gmr`) are scored by those documents and need no --triples. --json prints an object with recall, per_dataset, hallucinated_share, malformed and, for a `retrieve` directory, seconds_per_query (mean, p50). For a `retrieve` directory, selected questions without any response row are counted (without_response).

    --run scores another retriever's TREC run instead: each question's documents by score, cut at |gold| + 1 (or --top-k), named by doc id or title (a document the corpus does not hold is a hallucination). --trec-run / --trec-qrels write grtool's rows in the same format, so a standard tool reads them.

    Gold coverage: the share of the questions' gold documents that hold a docid in --triples (`coverage` in --json); below 100% a warning names the documents and questions no response can retrieve (docs/evaluation.md).

    On a `retrieve` directory written by a grtool checkpoint, the answered questions that checkpoint trained on (its grtool.json) are counted; any such question exits 1 unless --allow-train-overlap.

    Example: grtool eval recall out/retrieve/sft --corpus out/corpus --triples out/triples --per-question --json

    Example: grtool eval recall --run bm25.trec --corpus out/corpus --json
    """

    from grtool.log import console, log
    from grtool.vocab.readers import DocidIndex, QuestionIndex
    from grtool.evaluation.gold_coverage import coverage_warning, gold_coverage
    from grtool.evaluation.per_question import PerQuestion
    from grtool.evaluation.recall import evaluate_recall, query_seconds
    from grtool.evaluation.overlap import Overlap, refuse_overlap, train_overlap
    from grtool.evaluation.selection import needs_triples, selected_questions
    from grtool.evaluation.trec import TrecWriter, read_run
    from grtool.store.coverage import check_triples_cover

    if (responses is None) == (run is None):
        raise typer.BadParameter("give RESPONSES or --run FILE (a TREC run), one of them", param_hint="RESPONSES")
    if top_k is not None and run is None:
        raise typer.BadParameter("--top-k cuts a --run file's ranking; responses are scored as they are", param_hint="--top-k")
    if triples is None and responses is not None and needs_triples(responses):
        raise typer.BadParameter(f"{responses}: its responses name docids; scoring them needs --triples", param_hint="--triples")
    from grtool.store.outputs import input_stage, refuse_overlapping_outputs
    from grtool.store.partloop import claim_file

    # the stages it reads are inputs whole; a run directory holding them may hold its TREC files, as for every command
    given = [responses, run, corpus, triples]
    stages = [input_stage(responses, "responses"), input_stage(corpus, "questions"), input_stage(corpus, "documents"), input_stage(triples, "triples")]
    refuse_overlapping_outputs([("--trec-run", trec_run), ("--trec-qrels", trec_qrels)], inputs=stages, holders=given)
    with (
        claim_file(trec_run, "--trec-run", inputs=stages, holders=given) as run_file,
        claim_file(trec_qrels, "--trec-qrels", inputs=stages, holders=given) as qrels_file,
    ):  # before the scoring; fmt: skip
        check_triples_cover(triples, corpus)
        questions = QuestionIndex.build(corpus)
        source = responses if responses is not None else read_run(run, questions, corpus, top_k)  # type: ignore[arg-type]
        where = responses if responses is not None else run
        trec = TrecWriter(Path(str(where)).name) if trec_run is not None or trec_qrels is not None else None
        report = evaluate_recall(
            source, questions, DocidIndex.build(triples) if triples is not None else None,
            selected=selected_questions(responses, corpus) if responses is not None else None,
            per_question=PerQuestion(corpus) if per_question else None, on_score=trec.add if trec is not None else None,
            # docids reach only documents with triples; documents named outright (bm25, gmr, a TREC run) reach any
            coverage=(lambda qids: gold_coverage(corpus, triples, qids)) if triples is not None else None,
        )  # fmt: skip
        if "coverage" in report and (warning := coverage_warning(report["coverage"])):
            log.warning("%s", warning)
        report["seconds_per_query"] = query_seconds(responses) if responses is not None else None
        overlap = train_overlap(responses) if responses is not None else Overlap(None, None)  # the checkpoint's training questions among those answered
        report["train_overlap"] = overlap.as_dict(allowed=allow_train_overlap)
        console.print(overlap.line(), highlight=False)
        if trec is not None:
            trec.write(run_file, qrels_file)
    if as_json:
        print_report(report)
    else:
        print_recall(report)
        if per_question:
            print_per_question(report["questions"])
    if report["responses"] == 0:
        raise DataProblem(f"{where}: no response could be scored (unknown qids or no gold documents)")
    if not allow_train_overlap:
        refuse_overlap(overlap, where)


register(
    Command(
        "eval recall",
        recall_cmd,
        reads={"responses": TableInput("responses"), "corpus": TableInput("questions"), "triples": TableInput("triples"), "run": PathKind.FILE},
        writes={"trec_run": PathKind.REPORT, "trec_qrels": PathKind.REPORT},
        report="grtool.evaluation.recall:RecallSummary",
    )
)


def print_recall(report: dict) -> None:
    """The recall table per dataset (and what was not scored), as `eval recall` prints it."""
    from rich.table import Table

    from grtool.log import console

    if report["responses"]:
        table = Table(title="retrieval recall")
        for col in ("dataset", "responses", "recall", "exact", "docs/response", "hallucinated", "flipped", "malformed"):
            table.add_column(col, justify="left" if col == "dataset" else "right")
        rows = [*report["per_dataset"].items(), ("all", report)]
        for name, r in rows:
            table.add_row(
                name,
                str(r["responses"]),
                _fmt(r["recall"]),
                _fmt(r["exact_match_share"]),
                _fmt(r["docs_per_response"], 2),
                f"{r['hallucinated']}/{r['docids']} ({_fmt(r['hallucinated_share'], 3)})",
                str(r["flipped"]),
                str(r["malformed"]),
                style="bold" if name == "all" else None,
            )
        console.print(table)
    if report["unknown_qid"] or report["no_gold"] or report["incomplete_gold"]:
        examples = f" (e.g. {', '.join(report['unknown_qid_examples'])})" if report["unknown_qid_examples"] else ""
        console.print(
            f"[yellow]not scored:[/] {report['unknown_qid']} responses with an unknown qid{examples}, "
            f"{report['no_gold']} for questions without gold documents, "
            f"{report['incomplete_gold']} for questions whose gold is incomplete (meta.gold_titles_missing)",
            highlight=False,
        )
    if report.get("without_response"):
        console.print(
            f"[yellow]without a response:[/] {report['without_response']} of the {report['selected']} selected questions "
            f"(e.g. {', '.join(report['without_response_examples'])}; rejected as too long, or a part not done yet)",
            highlight=False,
        )


def print_per_question(questions: list[dict]) -> None:
    """One line per question: recall, exact set, docids, hallucinated, and the titles it retrieved (✓ gold, ✗ not)."""
    from rich.table import Table
    from rich.text import Text

    from grtool.log import console
    from grtool.userinput import escaped  # data's control characters (an ESC in a title) shown, never sent

    table = Table(title="per question")
    for col in ("qid", "dataset", "split", "recall", "exact", "docids", "halluc.", "retrieved (✓ gold, ✗ not gold)"):
        table.add_column(col, justify="right" if col in ("recall", "exact", "docids", "halluc.") else "left")
    for q in questions:
        retrieved = Text("no response row" if q["status"] != "scored" else "", style="yellow")
        seen: set[str] = set()
        for doc in (d for row in q["rows"] for d in row["retrieved"]):
            if doc["doc_id"] not in seen:
                seen.add(doc["doc_id"])
                gold = doc["verdict"] == "gold"
                retrieved.append(("; " if len(seen) > 1 else "") + ("✓ " if gold else "✗ ") + escaped(doc["title"] or doc["doc_id"]), style="green" if gold else "red")
        table.add_row(
            Text(escaped(q["qid"])), Text(escaped(q["dataset"])), Text(escaped(q["split"] or "-")), _fmt(q["recall"], 3), _fmt(q["exact"], 2), str(q["docids"]), str(q["hallucinated"]), retrieved
        )
    console.print(table)


def compare_cmd(
    reports: Annotated[list[str], typer.Argument(help="Runs as LABEL=PATH (or PATH: labelled by its name): a report of `eval recall --json`, or a `retrieve` output directory (scored here).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="FILE", help="Markdown file to write the table to (default: print it).")] = None,
    plot: Plot = None,
    as_json: Json = False,
    corpus: Annotated[Optional[Path], typer.Option("--corpus", help="Questions to score responses directories with (default: the questions stage each manifest names).")] = None,
    triples: Annotated[Optional[Path], typer.Option("--triples", help="Triples to score responses directories with (default: the stage each manifest names).")] = None,
    baseline: Annotated[Optional[str], typer.Option("--baseline", help="The run (by label) the others' per-question wins and losses are counted against (default: the first).")] = None,
    per_question: Annotated[bool, typer.Option("--per-question", help="Also list every question whose recall differs from the baseline's.")] = False,
    allow_different_questions: Annotated[bool, typer.Option("--allow-different-questions", help="Compare runs scored on different questions (a warning instead of exit 2).")] = False,
    allow_train_overlap: Annotated[
        bool, typer.Option("--allow-train-overlap", help="Compare runs that scored questions their model trained on (default: exit 1 naming them); the overlap is printed with the table.")
    ] = False,
    layout: Annotated[
        Layout,
        typer.Option(
            "--layout",
            help="default: recall per dataset with one column per run, the metrics, wins and losses; paper: one row per run × datasets with an Average column, seconds per query and p (the shape of ThinkGR's Table 1).",
        ),
    ] = Layout.default,
) -> None:
    """Recall per dataset of several runs side by side (e.g. base few-shot, after SFT, after KTO), every overall metric, and per-question wins and losses against a baseline.

    Per-question wins and losses need per-question recall: a responses directory, or a report of `eval recall --per-question --json`. Against the baseline each run gets the mean difference in recall with its 95% interval (paired bootstrap) and p-value (paired approximate randomization, two-sided; 10,000 draws, seed 0) over the questions both answered; a responses directory also gives seconds per query (mean, p50) from its latencies. Runs scored on different questions are refused (exit 2) unless --allow-different-questions; a label given twice is refused. A run that scored questions its checkpoint trained on (the verdict of `eval recall`) is refused (exit 1) unless --allow-train-overlap.

    Example: grtool eval compare base=out/retrieve/base sft=reports/recall-sft.json --out reports/recall.md --plot reports/recall.png
    """

    from grtool.log import log
    from grtool.evaluation.compare import Inputs, check_same_questions, check_train_overlap, comparison, load_runs, markdown, metrics, paper_markdown, plot as plot_runs, split_spec, table
    from grtool.store.outputs import refuse_overlapping_outputs
    from grtool.store.partloop import claim_file

    given = [split_spec(r)[1] for r in reports]
    refuse_overlapping_outputs([("--out", out), ("--plot", plot)], inputs=given)
    with claim_file(out, "--out", inputs=given, stdout=True) as out_file, claim_file(plot, "--plot", inputs=given) as plot_file:
        runs = load_runs(reports, Inputs(corpus, triples), baseline)
        for warning in check_same_questions(runs, allow_different_questions):
            log.warning("%s", warning)
        overlaps = check_train_overlap(runs, allow_train_overlap)
        for line in overlaps:
            log.warning("%s", line)
        text = paper_markdown(runs, baseline=baseline) if layout == Layout.paper else markdown(runs, baseline=baseline, listed=per_question)
        text += "".join(f"\n> {line}\n" for line in overlaps)  # the number stands beside what it includes
        if as_json:
            result = {"recall": table(runs), "metrics": metrics(runs), "per_question": comparison(runs, baseline, per_question), "train_overlap": overlaps}
            print_report(result)
        if out_file is not None:
            out_file.write(text.encode())
        elif not as_json:
            typer.echo(text)
        if plot_file is not None:
            plot_file.write_with(lambda tmp: plot_runs(runs, tmp))


register(
    Command(
        "eval compare",
        compare_cmd,
        reads={"reports": PathKind.LABELLED_FILE, "corpus": PathKind.STAGE, "triples": PathKind.STAGE},
        writes={"out": PathKind.REPORT, "plot": PathKind.REPORT},
        extras=plot_extras,
        report="grtool.evaluation.compare:CompareReport",
    )
)


@llm_options(needed=lambda options: options.get("answers") is None, max_tokens=32)
def answer_cmd(
    responses: Annotated[Optional[Path], typer.Argument(help="A `grtool retrieve` output directory: the reader answers from the documents each response retrieved. Not with --answers.")] = None,
    corpus: Annotated[Path, typer.Option("--corpus", help="Corpus run directory (its questions, with answers and aliases, and documents).")] = ...,  # type: ignore[assignment]
    answers: Annotated[Optional[Path], typer.Option("--answers", metavar="FILE.jsonl", help='Score answers another reader wrote instead: JSON Lines of {"qid": ..., "answer": ...}.')] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="DIR", help="Stage directory to write the reader's answers to (with RESPONSES).")] = None,
    judge: Annotated[
        Optional[str],
        typer.Option(
            "--judge",
            metavar="MODEL",
            help=f"Also have this model (same --backend; {DEFAULT_MODEL_NAME} is the embedded one) say of each prediction whether it is right: the judged accuracy, its verdicts kept per question.",
        ),
    ] = None,
    per_question: Annotated[bool, typer.Option("--per-question", help="With --json: also every scored question, its prediction, answers, EM, F1 and the judge's verdict.")] = False,
    max_empty_share: MaxEmptyShare("empty answers") = 0.2,
    overwrite: Overwrite = False,
    num_shards: NumShards = None,
    shard_index: ShardIndex = None,
    as_json: Json = False,
    llm: LLMSettings = None,
) -> None:
    """Answer accuracy: exact match and token F1 of answers, with SQuAD v1.1's normalisation (lower case, punctuation and the articles a/an/the removed, whitespace collapsed), each the best over the question's answer and its aliases.

    With RESPONSES a reader (--model, any backend) answers each question from the documents its first response retrieved (title and text, in the response's order); one row per question goes to --out, an answers stage that resumes and caches like every model stage. With --answers FILE.jsonl the answers of any other reader are scored. Unanswerable questions and unknown qids are counted, not scored.

    Example: grtool eval answer out/retrieve/sft --corpus out/corpus --out out/answers/sft --json

    Example: grtool eval answer --answers flashrag.jsonl --corpus out/corpus
    """
    from rich.table import Table

    from grtool.log import console
    from grtool.evaluation.answers import gold_answers, read_predictions, score_predictions

    if (responses is None) == (answers is None):
        raise typer.BadParameter("give RESPONSES (a reader answers) or --answers FILE.jsonl (answers to score), one of them", param_hint="RESPONSES")
    if responses is not None:
        if out is None or str(out) == "-":
            raise typer.BadParameter("the reader's answers need a stage directory: --out DIR", param_hint="--out")
        predictions = _read(responses, corpus, out, llm, judge, overwrite, num_shards, shard_index, max_empty_share)
    else:
        if out is not None or judge is not None:
            raise typer.BadParameter("--answers scores answers already written: there is nothing to judge or write to --out", param_hint="--answers")
        predictions = read_predictions(answers)  # type: ignore[arg-type]
    report = score_predictions(predictions, gold_answers(corpus), per_question=per_question)
    if as_json:
        print_report(report)
    else:
        table = Table(title="answer accuracy (SQuAD v1.1 normalisation)")
        judged = bool(report["judged"])
        for col in ("dataset", "scored", "EM", "F1", *(("judged", "judged accuracy") if judged else ())):
            table.add_column(col, justify="left" if col == "dataset" else "right")
        for name, r in [*report["per_dataset"].items(), ("all", report)]:
            cells = [str(r["scored"]), _fmt(r["exact_match"]), _fmt(r["f1"])] + ([str(r["judged"]), _fmt(r["judged_accuracy"])] if judged else [])
            table.add_row(name, *cells, style="bold" if name == "all" else None)
        console.print(table)
        skipped = report["not_scored"]
        if skipped["unknown_or_unanswerable_qid"] or skipped["repeated_qid"]:
            console.print(f"[yellow]not scored:[/] {skipped['unknown_or_unanswerable_qid']} answers to unknown or unanswerable questions "
                          f"({', '.join(skipped['examples'])}), {skipped['repeated_qid']} repeated qids (the first counts)", highlight=False)  # fmt: skip
    if report["scored"] == 0:
        raise DataProblem(f"{answers or out}: no answer could be scored (unknown qids, or questions without an answer)")


def _read(responses: Path, corpus: Path, out: Path, llm: LLMSettings, judge: str | None, overwrite: bool, num_shards, shard_index, max_empty_share: float):
    """The reader's stage; the predictions of every part (a task whose others are not done exits 1 saying so)."""
    from grtool.evaluation.reader import INSTRUCTION, JUDGE_INSTRUCTION, run_reader, stage_predictions
    from grtool.llm import make_backend
    from grtool.evaluation.selection import retrieve_manifest
    from grtool.store.outputs import refuse_overlapping_outputs

    if retrieve_manifest(responses) is None:
        raise typer.BadParameter(f"{responses}: not a `grtool retrieve` output directory (the reader needs the documents its rows name)", param_hint="RESPONSES")
    refuse_overlapping_outputs([("--out", out)], inputs=[responses, corpus])
    model_name = llm.model or (DEFAULT_MODEL_NAME if llm.backend != "openai" else None)
    sampling = llm.sampling()
    params = {**llm.identity(model_name), "sampling": sampling.as_dict(), "instruction": INSTRUCTION}
    if judge is not None:  # only when given: a reader-only output stays resumable
        params |= {"judge": judge, "judge_instruction": JUDGE_INSTRUCTION}
    options = llm.backend_options()
    manifest = run_reader(
        responses, corpus, out, llm.make_backend, sampling, model_name=model_name, params=params,
        cache_dir=llm.cache_dir_for(out), overwrite=overwrite, num_shards=num_shards, shard_index=shard_index, max_empty_share=max_empty_share,
        judge=(lambda: make_backend(llm.backend, judge, **options)) if judge is not None else None,
    )  # fmt: skip
    if manifest is None or not manifest.complete:
        raise DataProblem(f"{out}: other tasks' parts are not done yet; run `grtool eval answer --answers` or this command again when all are")
    return stage_predictions(out)


register(
    Command(
        "eval answer",
        answer_cmd,
        reads={"responses": TableInput("responses"), "corpus": TableInput("questions"), "answers": PathKind.FILE},
        writes={"out": TableOutput("answers"), "cache_dir": PathKind.DIRECTORY},
        extras=_answer_extras,
        report="grtool.evaluation.answers:AnswerReport",
    )
)
