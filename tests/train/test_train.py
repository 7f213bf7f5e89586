"""`grtool train sft|kto` with real TRL on the CPU: the training machinery on the tiny random SmolLM2 of
tests/train_helpers.py (cutoff 256, batch 2); what training teaches the real model is test_train_memorization.py."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import orjson
import pytest
import yaml

from grtool.docid import DOCID_END, DOCID_START
from grtool.vocab.prompt import instruction
from checkpoint_records import checkpoint_record_bytes
from conftest import run_cli
from hold_helpers import held
from train_helpers import PEOPLE, SHARED_SFT_ROWS, chain, finished_copy, question, write_kto, write_sft

pytestmark = pytest.mark.slow

TINY = ["--cutoff-len", "256", "--per-device-batch-size", "2"]


def record(ckpt: Path) -> dict:
    return orjson.loads((ckpt / "grtool.json").read_bytes())


def generate(ckpt: Path) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": instruction(question(0))}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])


def people_corpus(root: Path) -> Path:
    """A corpus of the questions above (one person and one city paragraph each) with their triples: the docids
    the trained models learnt to write."""
    import json

    from grtool.store.stage import read_table
    from conftest import run_cli
    from index_helpers import write_triples_stage

    records = [
        {"_id": f"p{i}", "question": question(i), "answer": country, "type": "bridge", "level": "easy", "supporting_facts": [[person, 0], [city, 0]],
         "context": [[person, [f"{person} was born in {city}."]], [city, [f"{city} is a city in {country}."]]]}
        for i, (person, city, country) in enumerate(PEOPLE)
    ]  # fmt: skip
    (root / "hotpot_dev_distractor_v1.json").write_text(json.dumps(records))
    run_cli("corpus", "ingest", root / "hotpot_dev_distractor_v1.json", "--out", root / "run")
    docs = {d["title"]: d["doc_id"] for d in read_table(root / "run" / "documents").to_pylist()}
    triples = {(person, "place of birth", city): person for person, city, _ in PEOPLE} | {(city, "country", country): city for _, city, country in PEOPLE}
    rows = [{"doc_id": docs[title], "idx": 0, "head": h, "relation": r, "tail": t, "docid": f"{DOCID_START}{h}, {r}, {t}{DOCID_END}"} for (h, r, t), title in triples.items()]
    write_triples_stage(root / "run" / "triples", rows)
    return root / "run"


def retrieve_with(ckpt: Path, root: Path, cli, *extra) -> dict:
    """`retrieve` with a trained checkpoint over an index built with its tokenizer; the summary."""
    run = people_corpus(root)
    cli("index", "build", run / "triples", "--tokenizer", ckpt, "--flips", "--out", root / "index")
    return orjson.loads(cli("retrieve", run, "--index", root / "index", "--model", ckpt, "--out", root / "responses", "--max-tokens", "48", *extra, "--json").stdout)


def test_sft_lowers_the_loss_and_ships_the_markers(sft_checkpoint):
    from transformers import AutoTokenizer

    meta = record(sft_checkpoint)
    assert meta["global_step"] == 4 and len(meta["losses"]) == 4
    assert meta["final_loss"] < meta["first_loss"], meta["losses"]
    assert meta["data"]["format"] == "llamafactory-sharegpt" and meta["data"]["rows"] == SHARED_SFT_ROWS and len(meta["data"]["sha256"]) == 64
    assert meta["command"][:3] == ["grtool", "train", "sft"]
    assert {"grtool", "trl", "torch"} <= set(meta["versions"]) and meta["hyperparameters"]["learning_rate"] == 1e-4
    tokenizer = AutoTokenizer.from_pretrained(str(sft_checkpoint))
    start, end = (tokenizer.encode(t, add_special_tokens=False) for t in (DOCID_START, DOCID_END))
    assert len(start) == 1 and len(end) == 1 and start != end
    assert [start[0], end[0]] == [meta["markers"]["docid_start"], meta["markers"]["docid_end"]]
    assert tokenizer.encode(f"{DOCID_START}a, b, c{DOCID_END}", add_special_tokens=False)[0] == start[0]
    generate(sft_checkpoint)


def test_validate_and_show_know_a_finished_checkpoint(sft_checkpoint, cli):
    """Before: validate and show said "nothing grtool wrote is here" (exit 1) of a checkpoint `train` wrote."""
    said = " ".join(cli("validate", sft_checkpoint).stdout.split() + cli("validate", sft_checkpoint).stderr.split())
    assert "checkpoint, train sft, 4 steps" in said, said
    assert "a training checkpoint, not a stage" in " ".join(cli("show", sft_checkpoint, check=2).stderr.split())


def test_labels_cover_the_assistant_turn_only(tmp_path):
    from grtool.train.config import resolve
    from grtool.train.run import build_trainer, plan

    data = write_sft(tmp_path / "sft.jsonl", n=4, fmt="trl-messages")
    p = plan("sft", data, None, tmp_path / "ckpt", resolve("sft", {"max_steps": 1, "cutoff_len": 512, "per_device_batch_size": 2}))
    trainer = build_trainer(p)
    tokenizer = trainer.processing_class
    for n, example in enumerate(trainer.train_dataset):
        labels = example["labels"]
        trained = [t for t in labels if t != -100]
        assert tokenizer.decode(trained).startswith(chain(n)), tokenizer.decode(trained)
        first = next(i for i, t in enumerate(labels) if t != -100)
        assert all(t != -100 for t in labels[first:])  # one contiguous span at the end: the assistant turn
        assert question(n) in tokenizer.decode(example["input_ids"][:first])  # the user turn is not trained


def test_lora_checkpoint_is_merged_and_has_an_adapter(tmp_path, cli, sft_checkpoint, tiny_model):
    data = write_sft(tmp_path / "sft.json", n=4)
    out = tmp_path / "lora"
    cli("train", "sft", data, "--model", tiny_model, "--out", out, "--lora", "--lora-rank", "4", "--lora-alpha", "8", "--lora-target", "q_proj,v_proj",
        "--max-steps", "1", "--learning-rate", "1e-3", *TINY)  # fmt: skip
    assert (out / "adapter" / "adapter_config.json").is_file()
    meta = record(out)
    assert meta["adapter"] == str(out / "adapter") and meta["hyperparameters"]["lora_rank"] == 4
    adapter = orjson.loads((out / "adapter" / "adapter_config.json").read_bytes())
    assert sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    generate(out)
    # the merged checkpoint, markers included, loads in `retrieve` over an index of its tokenizer (random weights
    # write no docid: what a trained model retrieves is test_train_memorization.py's)
    summary = retrieve_with(out, tmp_path, cli, "--max-empty-share", "1")
    assert summary["responses"] == len(PEOPLE) and summary["hallucinated"] == 0
    err = cli("retrieve", tmp_path / "run", "--index", tmp_path / "index", "--model", tiny_model, "--adapter", out / "adapter", "--out", tmp_path / "x", check=2).stderr
    assert f"--model {out}" in " ".join(err.split())  # the base model has no marker rows: the merged checkpoint does
    # The adapter on its own merged checkpoint (merged twice), on another base model, or with a tokenizer of its own
    # that decoding would not use: each refused before the model loads.
    retrieve = ("retrieve", tmp_path / "run", "--index", tmp_path / "index", "--out", tmp_path / "x")
    err = " ".join(cli(*retrieve, "--model", out, "--adapter", out / "adapter", check=2).stderr.split())
    assert "is its own merged checkpoint, which holds the adapter already" in err and "Traceback" not in err
    err = " ".join(cli(*retrieve, "--model", sft_checkpoint, "--adapter", out / "adapter", check=2).stderr.split())
    assert "trained on base model" in err and f"not on --model {sft_checkpoint}@" in err
    err = " ".join(cli(*retrieve, "--adapter", out / "adapter", check=2).stderr.split())  # the default model is not its base either
    assert f"not on --model SmolLM2-135M-Instruct; give --model {tiny_model}" in err
    own = tmp_path / "own-tokenizer"
    shutil.copytree(out / "adapter", own)
    shutil.copy(out / "tokenizer.json", own / "tokenizer.json")  # the markers' tokens: the base model has none
    shutil.copy(out / "tokenizer_config.json", own / "tokenizer_config.json")
    err = " ".join(cli(*retrieve, "--model", tiny_model, "--adapter", own, check=2).stderr.split())
    assert "its tokenizer is not the model's" in err and "<docid_start>" in err


def test_kto_runs_from_the_sft_checkpoint(sft_checkpoint, tmp_path, cli):
    data = write_kto(tmp_path / "thinkgr_kto.json", 8, 8)
    out = tmp_path / "kto"
    cli("train", "kto", data, "--model", sft_checkpoint, "--out", out, "--max-steps", "1", "--save-steps", "1", *TINY)  # KTO's checkpoint save too
    meta = record(out)
    assert meta["kind"] == "train kto" and meta["global_step"] == 1
    assert meta["data"]["desirable"] == 8 and meta["data"]["undesirable"] == 8
    assert meta["hyperparameters"]["beta"] == 0.1 and meta["hyperparameters"]["desirable_weight"] == 1.0
    assert meta["base_model"]["path"] == str(sft_checkpoint)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob("checkpoint-*"))  # a finished run removes what only --resume needed


def test_resume_refuses_an_occupied_out_without_resume(sft_checkpoint, tmp_path, cli):
    data = write_sft(tmp_path / "thinkgr_sft.json")
    finished = finished_copy(sft_checkpoint, tmp_path / "finished")
    before = (finished / "grtool.json").read_bytes()
    proc = cli("train", "sft", data, "--out", finished, "--max-steps", "5", *TINY, check=2)
    assert "--resume" in proc.stderr and "--overwrite" in proc.stderr
    assert (finished / "grtool.json").read_bytes() == before


def test_dry_run_and_llamafactory_yaml(tmp_path, cli):
    data = write_sft(tmp_path / "thinkgr_sft.json", n=600)  # the paper's batch of 512 needs that many rows
    proc = cli("train", "sft", data, "--out", tmp_path / "ckpt", "--preset", "thinkgr", "--per-device-batch-size", "4", "--dry-run", "--json")
    report = orjson.loads(proc.stdout)
    assert report["rows"] == 600 and report["effective_batch_size"] == 512 and report["steps"] == 1
    cfg = report["config"]
    assert (cfg["learning_rate"], cfg["cutoff_len"], cfg["warmup_ratio"], cfg["lora"], cfg["gradient_accumulation"]) == (1e-6, 2048, 0.05, False, 128)
    assert not (tmp_path / "ckpt").exists()
    # --config file, explicit options win over it
    conf = tmp_path / "sft.yaml"
    conf.write_text("learning_rate: 3.0e-5\nper_device_batch_size: 2\ngradient_accumulation: 4\nepochs: 2\n")
    report = orjson.loads(cli("train", "sft", data, "--out", tmp_path / "ckpt", "--config", conf, "--learning-rate", "1e-5", "--dry-run", "--json").stdout)
    assert report["config"]["learning_rate"] == 1e-5 and report["effective_batch_size"] == 8 and report["steps"] == 150
    plain = cli("train", "sft", data, "--out", tmp_path / "ckpt", "--dry-run").stderr
    assert "effective batch" in plain and "steps" in plain

    target = tmp_path / "lf" / "thinkgr_sft.yaml"
    cli("train", "sft", data, "--out", target, "--preset", "thinkgr", "--deepspeed", Path("examples/deepspeed/zero3.json").resolve(), "--format", "llamafactory-yaml")
    lf = yaml.safe_load(target.read_text())
    assert lf["stage"] == "sft" and lf["finetuning_type"] == "full" and lf["dataset"] == "thinkgr_sft" and lf["dataset_dir"] == str(tmp_path)
    assert lf["learning_rate"] == 1e-6 and lf["cutoff_len"] == 2048 and lf["warmup_ratio"] == 0.05 and lf["add_special_tokens"] == f"{DOCID_START},{DOCID_END}"
    assert lf["deepspeed"].endswith("zero3.json") and lf["output_dir"] == str(target.with_suffix(""))
    kto = write_kto(tmp_path / "thinkgr_kto.json", 160, 40)
    lf = yaml.safe_load(cli("train", "kto", kto, "--out", "-", "--preset", "thinkgr", "--format", "llamafactory-yaml").stdout)
    assert lf["stage"] == "kto" and lf["pref_beta"] == 0.1 and lf["learning_rate"] == 4e-7
    assert (lf["kto_chosen_weight"], lf["kto_rejected_weight"]) == (1.0, 4.0)


def test_bad_input_exits_2_and_writes_nothing(tmp_path, cli):
    out = tmp_path / "ckpt"
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert "empty" in cli("train", "sft", empty, "--out", out, check=2).stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [')
    assert "broken.jsonl" in cli("train", "sft", broken, "--out", out, check=2).stderr
    one_class = write_kto(tmp_path / "one.json", 6, 0)
    assert "both desirable and undesirable" in cli("train", "kto", one_class, "--out", out, check=2).stderr
    small = write_sft(tmp_path / "small.json", n=3)
    err = cli("train", "sft", small, "--out", out, "--per-device-batch-size", "2", "--gradient-accumulation", "2", check=2).stderr
    assert "small.json" in err and "effective batch of 4" in err
    # a base model without a chat template: say what to pass
    from grtool.models import resolve_model

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(Path(resolve_model(None).path) / name, bare / name)
    (bare / "model.safetensors").symlink_to(Path(resolve_model(None).path) / "model.safetensors")  # a model folder has weights
    config = orjson.loads((bare / "tokenizer_config.json").read_bytes())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_bytes(orjson.dumps(config))
    data = write_sft(tmp_path / "sft.json", n=4)
    assert "--chat-template" in cli("train", "sft", data, "--model", bare, "--out", out, check=2).stderr
    template = tmp_path / "chatml.jinja"
    template.write_text((Path(resolve_model(None).path) / "chat_template.jinja").read_text())
    cli("train", "sft", data, "--model", bare, "--chat-template", template, "--out", out, "--dry-run")
    assert not out.exists()


def test_sft_from_a_filtered_chains_stage(tmp_path, cli, samples):
    """DATA may be the filtered-chains stage: rows built as `export sft` builds them (selected chains, known qids)."""
    from sample_helpers import write_chains

    from grtool.train.data import load_sft

    chains = write_chains(samples, tmp_path / "filtered")
    data = load_sft(tmp_path / "filtered", corpus=str(samples["root"]))
    assert data.fmt == "filtered-chains" and len(data.rows) == len(chains)
    by_question = {row["prompt"][-1]["content"]: row["completion"][0]["content"] for row in data.rows}
    for qid, text in chains.items():
        assert by_question[instruction(samples["question"][qid])] == text
    report = orjson.loads(cli("train", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", tmp_path / "ckpt", "--dry-run", "--json").stdout)
    assert report["rows"] == len(chains) and report["data_format"] == "filtered-chains"
    err = cli("train", "sft", tmp_path / "filtered", "--out", tmp_path / "ckpt", "--dry-run", check=2).stderr
    assert "--corpus" in err
    # --cannot-answer builds the instruction as `export sft --cannot-answer` does
    named = load_sft(tmp_path / "filtered", corpus=str(samples["root"]), cannot_answer="Not answerable here.")
    assert {row["prompt"][-1]["content"] for row in named.rows} == {instruction(samples["question"][q], "special", "Not answerable here.") for q in chains}
    err = cli("train", "sft", tmp_path / "filtered", "--corpus", samples["root"], "--out", tmp_path / "ckpt", "--dry-run", "--cannot-answer", " ", check=2).stderr
    assert "--cannot-answer" in err


def test_sft_on_export_gmr_pairs_trains_the_gmr_request_and_retrieve_checks_the_mode(tmp_path, cli, samples, tiny_model):
    """`export gmr` pairs are SFT data: the prompt is the request `retrieve --mode gmr` sends at that step, the
    target the completion; the checkpoint records data format gmr and `retrieve` refuses it in the other mode."""
    from grtool.retrieve.gmr import step_messages
    from grtool.train.data import load_sft

    pairs = tmp_path / "gmr.jsonl"
    cli("export", "gmr", samples["root"], "--out", pairs)
    records = [orjson.loads(line) for line in pairs.read_bytes().splitlines()]
    data = load_sft(pairs)
    assert data.fmt == "gmr" and len(data.rows) == len(records)
    evidence: dict[str, list[str]] = {}
    for pair, row in zip(records, data.rows):
        seen = evidence.setdefault(pair["qid"], [])
        assert row["prompt"] == step_messages(samples["question"][pair["qid"]], seen)  # what retrieve decodes with
        assert row["completion"] == [{"role": "assistant", "content": pair["target"]}]
        seen.append(pair["target"])
    assert any(r["completion"][0]["content"] == "DONE" for r in data.rows)

    ckpt = tmp_path / "ckpt"
    cli("train", "sft", pairs, "--model", tiny_model, "--out", ckpt, "--max-steps", "1", "--cutoff-len", "128", "--per-device-batch-size", "2")
    assert record(ckpt)["data"]["format"] == "gmr"
    err = cli("retrieve", samples["root"], "--index", tmp_path / "no-index", "--model", ckpt, "--out", tmp_path / "x", check=2).stderr
    assert "--mode gmr" in err and "export gmr" in err
    chains_model = tmp_path / "chains-model"  # a chains checkpoint's record (only what the check reads)
    chains_model.mkdir()
    (chains_model / "grtool.json").write_bytes(checkpoint_record_bytes())
    err = cli("retrieve", samples["root"], "--index", tmp_path / "no-index", "--mode", "gmr", "--model", chains_model, "--out", tmp_path / "y", check=2).stderr
    assert "--mode docids" in err
    # A file mixing GMR pairs and chat rows, or whose export record disagrees with its rows, is refused.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(pairs.read_bytes() + write_sft(tmp_path / "sft.jsonl", n=2, fmt="trl-messages").read_bytes())
    assert "mixes" in cli("train", "sft", mixed, "--out", tmp_path / "m", "--dry-run", check=2).stderr


def test_kto_labels_responses_on_the_fly(tmp_path, cli, samples):
    """DATA may be sampled responses with --corpus and --triples: labelled with `export kto`'s rule, same rows."""
    from sample_helpers import write_responses

    from grtool.train.data import load_kto

    root = samples["root"]
    responses = write_responses(tmp_path / "responses.jsonl")
    exported = tmp_path / "kto.jsonl"
    cli("export", "kto", responses, "--corpus", root, "--triples", root / "triples", "--format", "trl", "--out", exported)
    on_the_fly = load_kto(responses, corpus=str(root), triples=str(root / "triples"))
    assert on_the_fly.rows == load_kto(exported).rows and on_the_fly.fmt == "responses"
    assert on_the_fly.fingerprint["labelling"]["desirable"] == 2 and on_the_fly.fingerprint["labelling"]["unknown_qid"] == 1
    args = ("train", "kto", responses, "--corpus", root, "--triples", root / "triples", "--out", tmp_path / "ckpt", "--dry-run", "--json")
    for extra, desirable, undesirable in (((), 2, 2), (("--tau", "1.0"), 2, 6), (("--desirable", "all-gold"), 3, 2)):
        report = orjson.loads(cli(*args, *extra).stdout)
        assert (report["desirable"], report["undesirable"]) == (desirable, undesirable), extra
    assert "--triples" in cli("train", "kto", responses, "--corpus", root, "--out", tmp_path / "ckpt", "--dry-run", check=2).stderr
    assert "--corpus" in cli("train", "kto", tmp_path, "--out", tmp_path / "ckpt", "--dry-run", check=2).stderr
    assert not (tmp_path / "ckpt").exists()


def test_resume_continues_the_killed_run_from_its_last_complete_checkpoint(sft_checkpoint, tmp_path, cli, tiny_model):
    """A run killed after its step-4 checkpoint (the fixture's, without its final files) continues with --resume.
    It was also killed during later saves: one as saves were before they were atomic (checkpoint-6 under its
    final name without its trainer state, optimizer.pt cut), one during an atomic save (the temporary folder).
    --resume removes both, says so, and resumes from checkpoint-4 (before: a traceback loading checkpoint-6)."""
    from grtool.train.run import STAGING, checkpoint_problem

    out = tmp_path / "resumed"
    shutil.copytree(sft_checkpoint / "checkpoint-4", out / "checkpoint-4")
    complete = out / "checkpoint-4"
    assert checkpoint_problem(complete) is None
    cut = out / "checkpoint-6"
    cut.mkdir()
    for name in ("config.json", "generation_config.json"):  # written before the kill, as the weights
        shutil.copy(complete / name, cut / name)
    (cut / "model.safetensors").hardlink_to(complete / "model.safetensors")  # read only, never written
    (cut / "optimizer.pt").write_bytes((complete / "optimizer.pt").read_bytes()[: 1 << 20])  # the kill came mid-write
    assert checkpoint_problem(cut) == "no trainer_state.json"
    shutil.copy(complete / "trainer_state.json", cut / "trainer_state.json")
    assert checkpoint_problem(cut) == "optimizer.pt is cut short"
    (cut / "trainer_state.json").unlink()
    staged = out / STAGING / "checkpoint-8"
    staged.mkdir(parents=True)
    (staged / "model.safetensors").write_bytes(b"\0" * 64)
    mine = out / "checkpoint-best-mine"  # a user's folder: a finished run removed it with the trainer's checkpoints
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    data = write_sft(tmp_path / "thinkgr_sft.json")
    proc = cli("train", "sft", data, "--model", tiny_model, "--out", out, "--resume", "--max-steps", "6", "--save-steps", "2", "--learning-rate", "1e-4", "--warmup-ratio", "0", *TINY)
    err = " ".join(proc.stderr.split())
    assert "resuming from checkpoint-4" in err and "checkpoint-6 is incomplete (no trainer_state.json" in err and STAGING in err, proc.stderr
    meta = record(out)
    assert meta["resumed_from"].endswith("checkpoint-4") and meta["global_step"] == 6
    assert [x["step"] for x in meta["losses"]] == [5, 6]
    assert not list(out.glob("checkpoint-[0-9]*")) and not (out / STAGING).exists()  # a finished run keeps none
    assert (mine / "notes.txt").read_text() == "mine"


def test_sigterm_finishes_the_step_saves_a_checkpoint_and_exits_transient(tmp_path, tiny_model):
    """SIGTERM (Slurm's time limit) while checkpoint-3 is being written (held at `saving`: its files written under
    the temporary name): the save completes (no checkpoint-N under its final name misses a file; before atomic saves
    a kill left checkpoint-2 without its trainer state, which --resume then picked), the step after it runs and is
    saved although --save-steps 3 would not save it, and the run stops with exit 75 naming the checkpoint --resume
    starts from (before: killed by the signal, the steps since the last save lost). Resuming from what is left is
    the test above; here only the choice is checked (no second model load)."""
    from grtool.train.run import STAGING, checkpoint_problem, last_complete_checkpoint

    data = write_sft(tmp_path / "thinkgr_sft.json")
    out = tmp_path / "ckpt"
    proc = held(["train", "sft", data, "--model", tiny_model, "--out", out, "--save-steps", "3", "--save-total-limit", "1", "--learning-rate", "1e-4",
                 "--warmup-ratio", "0", *TINY, "--max-steps", "8"], "saving", signal.SIGTERM, tmp_path / "holds")  # fmt: skip
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert not (out / STAGING).exists() and not (out / "grtool.json").exists()  # stopped, not finished
    finals = sorted(f.name for f in out.glob("checkpoint-*"))
    assert finals == ["checkpoint-4"], finals  # the save the stop asked for; checkpoint-3 rotated out (limit 1)
    assert checkpoint_problem(out / "checkpoint-4") is None and last_complete_checkpoint(out) == out / "checkpoint-4"
    said = " ".join(proc.stderr.split())
    assert "training stopped at step 4; checkpoint-4 is the last complete checkpoint" in said, said[-2000:]
    assert "run the same command with --resume to continue (exit 75)" in said, said[-2000:]
    # before: validate said "nothing grtool wrote is here" of a checkpoint folder, finished or not
    stopped = run_cli("validate", out, check=1)
    assert "a training run started here" in " ".join(stopped.stderr.split()) + " ".join(stopped.stdout.split())
