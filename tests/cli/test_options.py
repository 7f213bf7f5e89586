"""Options are checked before anything is written: enumerated options are choices (listed by --help, offered by
shell completion, a usage error at once), and a bad value or combination leaves no output behind."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from conftest import EXAMPLES, TEST_DATA, run_cli

TRIPLES_JSONL = TEST_DATA / "index_triples.jsonl"

# Options whose values are a fixed list: each must be a choice wherever a command has it.
ENUMERATED = {"--backend", "--kind", "--source", "--markers", "--mode", "--format", "--select", "--unanswerable", "--grounding",
              "--view", "--desirable", "--redundant", "--preset"}  # fmt: skip


def _commands():
    """Every leaf command of `grtool` as (words, click command, a context to ask it in)."""
    import typer

    from grtool.cli.main import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    stack = [((), root)]
    while stack:
        words, command = stack.pop()
        if hasattr(command, "list_commands"):
            stack += [((*words, name), command.get_command(ctx, name)) for name in command.list_commands(ctx)]
        else:
            yield " ".join(words), command, ctx


def test_every_enumerated_option_is_a_choice():
    found = {}
    for name, command, ctx in _commands():
        for param in command.params:
            flags = set(getattr(param, "opts", ())) & ENUMERATED
            if not flags:
                continue
            # what shell completion offers: the values of a choice, nothing for free text
            offered = [item.value for item in param.shell_complete(ctx, "")]
            assert offered, f"grtool {name} {min(flags)} takes any text; make it a choice"
            found[f"{name} {min(flags)}"] = offered
    # the commands that generate (three --backend), index build (--kind, --source), train kto --desirable, ...
    for expected in ("triples extract --backend", "chains synthesize --backend", "retrieve --backend", "index build --kind",
                     "index build --source", "train kto --desirable", "export sft --format", "retrieve --mode"):  # fmt: skip
        assert expected in found
    assert found["index build --kind"] == ["fm", "trie", "numpy"] and found["retrieve --backend"] == ["transformers", "openai", "vllm"]
    assert found["train kto --desirable"] == ["exact", "all-gold"]


def test_index_build_help_lists_the_values_and_does_not_promise_json_lines_on_stdout():
    """`index build --out -` is refused (an index is a directory of files): its help must not offer it."""
    out = " ".join(run_cli("index", "build", "--help", env={"COLUMNS": "250"}).stdout.split())
    assert "fm|trie|numpy" in out and "docids|documents" in out
    assert "JSON Lines" not in out and "'-' is refused" in out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A real corpus (ingested example) and a real triples stage, the inputs the commands below would accept."""
    from grtool.corpus.ingest import ingest
    from grtool.store.schemas import TRIPLES
    from grtool.store.stage import StageSpec, StageWriter

    root = tmp_path_factory.mktemp("inputs")
    ingest([EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json"], str(root / "corpus"))
    triples = root / "triples"
    stage = StageWriter(triples, StageSpec("triples", TRIPLES))
    rows = [json.loads(line) for line in TRIPLES_JSONL.read_text().splitlines()]
    with stage.shard(0) as sh:
        sh.count_in(len(rows))
        sh.write_rows(rows)
    stage.finish()
    (root / "responses.jsonl").write_text('{"qid": "q1", "response": "x"}\n')
    (root / "docs.jsonl").write_text('{"title": "A", "text": "a"}\n')  # documents of which dataset? needs --dataset
    turn = {"messages": [{"role": "user", "content": "Where?"}, {"role": "assistant", "content": "<docid_start>A, in, B<docid_end>"}]}
    (root / "sft.jsonl").write_text((json.dumps(turn) + "\n") * 4)  # TRL messages rows, enough for a batch
    mixed = root / "mixed"  # a folder whose second file needs --dataset: found in phase 1, not by the first look
    mixed.mkdir()
    (mixed / "a_hotpot_dev.json").write_bytes((EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json").read_bytes())
    (mixed / "b_docs.jsonl").write_text('{"title": "A", "text": "a"}\n')
    (root / "bad.yaml").write_text("learning_rate: fast\n")  # was: a TypeError deep in the checks
    (root / "scheduler.yaml").write_text("lr_scheduler: foo\n")
    return {
        "corpus": root / "corpus",
        "triples": triples,
        "responses": root / "responses.jsonl",
        "docs": root / "docs.jsonl",
        "sft": root / "sft.jsonl",
        "bad_config": root / "bad.yaml",
        "bad_scheduler": root / "scheduler.yaml",
        "mixed": mixed,
        "hotpot": EXAMPLES / "hotpotqa" / "hotpot_dev_distractor_v1.example.json",
    }


# (command words with {corpus}/{triples}/{responses}/{out} placeholders, the option the message must name)
BAD = [
    ("triples extract {corpus} --out {out} --backend foo --limit 1", "--backend"),
    ("triples extract {corpus} --out {out} --backend openai --tensor-parallel-size 2 --limit 1", "--tensor-parallel-size"),
    ("triples extract {corpus} --out {out} --backend transformers --base-url http://127.0.0.1:9/v1 --limit 1", "--base-url"),
    # a URL no request could go to is an option error (exit 2), found before OUT is created; not a crash, not exit 75
    ("triples extract {corpus} --out {out} --backend openai --base-url http://127.0.0.1:99999/v1 --limit 1", "--base-url"),
    ("triples extract {corpus} --out {out} --backend openai --base-url http://[::1/v1 --limit 1", "--base-url"),
    ("triples extract {corpus} --out {out} --backend openai --base-url ftp://127.0.0.1:9/v1 --limit 1", "--base-url"),
    ("triples extract {corpus} --out {out} --backend openai --base-url 127.0.0.1:9/v1 --model m --limit 1", "--base-url"),
    ("chains synthesize {corpus} --triples {triples} --out {out} --backend openai --base-url http:///v1", "--base-url"),
    ("retrieve {corpus} --index {triples} --out {out} --backend openai --base-url http://127.0.0.1:0/v1", "--base-url"),
    ("chains synthesize {corpus} --triples {triples} --out {out} --backend foo", "--backend"),
    ("retrieve {corpus} --index {triples} --out {out} --backend foo", "--backend"),
    ("index build {triples} --tokenizer llama3 --out {out} --kind foo", "--kind"),
    ("index build {triples} --tokenizer llama3 --out {out} --source foo", "--source"),
    ("index build {triples} --tokenizer llama3 --out {out} --memory-limit lots", "--memory-limit"),
    ("index build {triples} --tokenizer llama3 --out {out} --source documents --flips", "--flips"),
    ("train kto {responses} --corpus {corpus} --triples {triples} --out {out} --desirable foo", "--desirable"),
    ("export sft {triples} --corpus {corpus} --out {out} --format foo", "--format"),
    # loggers transformers would refuse only once the trainer is built, after OUT/grtool-run.json was written
    ("train kto {responses} --corpus {corpus} --triples {triples} --out {out} --report-to foo", "--report-to"),
    ("train sft {sft} --out {out} --report-to foo", "--report-to"),
    ("train sft {sft} --out {out} --report-to tensorboard,all", "--report-to"),
    ("train sft {sft} --out {out} --report-to none,swanlab", "--report-to swanlab"),
    ("train sft {sft} --out {out} --report-to kubeflow", "KUBEFLOW_TRAINER_SERVER_URL"),  # outside a Kubeflow TrainJob
    # values that were taken silently: no documents at all, docid markers no docid can be read back between
    ("triples extract {corpus} --out {out} --limit 0", "--limit"),
    ("triples extract {corpus} --out {out} --backend openai --model m --max-retries 0 --docid-start '' --limit 1", "--docid-start"),
    ("triples extract {corpus} --out {out} --backend openai --model m --max-retries 0 --docid-start X --docid-end X --limit 1", "--docid-start"),
    ("chains synthesize {corpus} --triples {triples} --out {out} --backend openai --model m --max-retries 0 --docid-start <d --docid-end <d>", "--docid-end"),
    # a --model no local backend could load (was: found when the model loaded, after OUT was created)
    ("chains synthesize {corpus} --triples {triples} --out {out} --model {out}/missing", "--model"),
    ("triples extract {corpus} --out {out} --model missing.gguf", "--model"),
    ("triples extract {corpus} --out {out} --model {responses}", "--model"),
    # training values TRL/transformers/peft would take, or refuse only once the trainer is built
    ("train kto {responses} --corpus {corpus} --triples {triples} --out {out} --beta -1", "--beta"),
    ("train kto {responses} --corpus {corpus} --triples {triples} --out {out} --desirable-weight 0", "--desirable-weight"),
    ("train sft {sft} --out {out} --lora --lora-target ,", "--lora-target"),
    ("train sft {sft} --out {out} --config {bad_config}", "learning_rate"),
    ("train sft {sft} --out {out} --config {bad_scheduler}", "lr_scheduler"),
    ("retrieve {corpus} --index {triples} --out {out} --model {corpus} --samples 2 --temperature 0", "--temperature 0"),
    # each input's dataset is chosen from its first record before OUT is created
    ("corpus ingest {docs} --out {out}", "--dataset"),
    ("corpus ingest {hotpot} {docs} --out {out}", "--dataset"),
    ("corpus ingest {hotpot} --dataset musique --out {out}", "--dataset"),
    ("corpus ingest {hotpot} --split '' --out {out}", "--split"),
    ("corpus ingest {mixed} --out {out}", "--dataset"),  # the run removes the OUT it made
]


def grtool_in_process(words: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """The `grtool` entry point itself (grtool.cli.main.run), in this process: a subprocess per case would spend
    seconds importing; (exit code, stderr)."""
    import sys

    from grtool.cli.main import run

    monkeypatch.setattr(sys, "argv", ["grtool", *words])
    monkeypatch.setenv("COLUMNS", "300")
    with pytest.raises(SystemExit) as e:
        run(ends_process=False)
    return e.value.code, " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("line,option", BAD, ids=[b[0].split(" {")[0] + " " + b[1] for b in BAD])  # the same id twice gets a suffix
def test_a_bad_option_is_refused_before_anything_is_created(inputs, tmp_path, monkeypatch, capsys, line, option):
    out = tmp_path / "out"
    code, err = grtool_in_process([w.format(out=out, **inputs) for w in shlex.split(line)], monkeypatch, capsys)
    assert code == 2 and option in err and "Traceback" not in err, err
    assert not out.exists(), f"{out} was created before the option was refused: {sorted(p.name for p in out.iterdir())}"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lock or scratch beside it either


def test_a_pipeline_checks_every_stage_s_options_before_the_first_stage_runs(inputs, tmp_path, monkeypatch, capsys):
    """The second stage's bad --kind used to be found only after the first stage had built its index."""
    config = tmp_path / "p.toml"
    stage = '[[stages]]\nname = "{name}"\nrun = "index build"\nargs = ["{triples}"]\noptions = {{ tokenizer = "llama3", kind = "{kind}", out = "{{out}}/{name}" }}\n'
    config.write_text(f'out = "{tmp_path / "out"}"\n' + stage.format(name="a", kind="numpy", **inputs) + stage.format(name="b", kind="foo", **inputs))
    code, err = grtool_in_process(["pipeline", "run", str(config)], monkeypatch, capsys)
    assert code == 2 and "stage 'b'" in err and "--kind" in err and "'foo' is not one of" in err, err
    assert not (tmp_path / "out").exists()


def test_an_ingest_failing_in_an_archive_s_later_member_leaves_no_empty_out(inputs, tmp_path, monkeypatch, capsys):
    """Members after an archive's first are only read in phase 1 (reaching them means decompressing the rest):
    when one is refused, the run removes the OUT (and parents) it created, and nothing that was there before."""
    import tarfile

    archive = tmp_path / "mixed.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(inputs["hotpot"], arcname="a/hotpot_dev.json")
        tar.add(inputs["docs"], arcname="b/docs.jsonl")
    out = tmp_path / "new" / "out"
    code, err = grtool_in_process(["corpus", "ingest", str(archive), "--out", str(out)], monkeypatch, capsys)
    assert code == 2 and "docs.jsonl" in err and "--dataset" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.tar"]
    (tmp_path / "mine").mkdir()  # an OUT that was there before the run stays
    code, err = grtool_in_process(["corpus", "ingest", str(archive), "--out", str(tmp_path / "mine")], monkeypatch, capsys)
    assert code == 2 and (tmp_path / "mine").is_dir(), err


def test_index_query_refuses_a_negative_token_id():
    """`index query --ids` with a negative id used to answer "0 matches" as if it had looked something up."""
    from grtool.errors import InputError
    from grtool.index.query import parse_ids

    assert parse_ids("128256, 791") == [128256, 791] and parse_ids("") == []
    for bad in ("128256,-5", "a,b"):
        with pytest.raises(InputError, match="--ids"):
            parse_ids(bad)


def test_a_pipeline_checks_every_stage_s_llm_options_before_the_first_stage_runs(inputs, tmp_path, monkeypatch, capsys):
    """The LLM options' own checks (here a --base-url no request could go to) are made for every stage up front,
    not when that stage's turn comes."""
    config = tmp_path / "p.toml"
    config.write_text(
        f'out = "{tmp_path / "out"}"\n'
        f'[[stages]]\nname = "a"\nrun = "index build"\nargs = ["{inputs["triples"]}"]\n'
        'options = { tokenizer = "llama3", kind = "numpy", out = "{out}/a" }\n'
        f'[[stages]]\nname = "b"\nrun = "triples extract"\nargs = ["{inputs["corpus"]}"]\n'
        'options = { backend = "openai", base_url = "http://127.0.0.1:99999/v1", model = "m", out = "{out}/b" }\n'
    )
    code, err = grtool_in_process(["pipeline", "run", str(config)], monkeypatch, capsys)
    assert code == 2 and "stage 'b'" in err and "--base-url" in err, err
    assert not (tmp_path / "out").exists()
