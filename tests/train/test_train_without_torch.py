"""`train sft|kto` decides its refusals and a whole --dry-run without importing torch (issue #48): torch, and
AutoTokenizer's module which imports it, took seconds before every dry run and every mistake could be answered.
What only torch can tell about a model folder (its check against the weights, the tokenizer class AutoTokenizer
picks, the layers LoRA can adapt) is learned once and remembered in grtool's cache, never in the folder; the
tokenizer loaded through the remembered class is AutoTokenizer's own, token for token.
"""

from __future__ import annotations

import os
import shutil

import orjson
import pytest

from imports_helpers import without_torch
from train_helpers import finished_copy, shared_sft_args, write_kto, write_sft

pytestmark = pytest.mark.slow  # the shared SFT checkpoint (tests/conftest.py) is trained once per session

TINY = ["--cutoff-len", "128", "--per-device-batch-size", "2"]


def _state(folder) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


def _lengths(tokenizer, rows: list[dict]) -> tuple[list[str], list[int], list[int]]:
    """The rendered prompts and each row's token counts, prompt alone and whole, as drop_long_prompts takes them."""
    prompts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    whole = [tokenizer.apply_chat_template([*r["prompt"], *r["completion"]], tokenize=False) for r in rows]
    count = lambda texts: [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]  # noqa: E731
    return prompts, count(prompts), count(whole)


def _verdict(tokenizer, template: str) -> str:
    from grtool.errors import InputError
    from grtool.models import check_chat_template

    tokenizer.chat_template = template
    try:
        check_chat_template(tokenizer, "--chat-template t.jinja")
    except InputError as e:
        return str(e)
    return "renders"


def test_the_remembered_tokenizer_class_gives_autotokenizers_counts_and_verdicts(sft_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    from grtool.models import fact_file, recall
    from grtool.train.data import load_sft
    from grtool.train.model import TOKENIZER_CLASS, load_model_tokenizer, resolve

    rows = load_sft(write_sft(tmp_path / "sft.json", n=16)).rows
    before = _state(sft_checkpoint)
    for ref in (resolve(None), resolve(str(sft_checkpoint))):
        entry = fact_file(ref.path, TOKENIZER_CLASS)
        entry.unlink(missing_ok=True)
        load_model_tokenizer(ref)  # through AutoTokenizer: the class it picks is remembered
        assert recall(entry, str) == "transformers.tokenization_utils_tokenizers:TokenizersBackend"
        remembered, auto = load_model_tokenizer(ref), AutoTokenizer.from_pretrained(ref.path)
        assert type(remembered) is type(auto) and len(remembered) == len(auto) and remembered.get_vocab() == auto.get_vocab()
        assert remembered.chat_template == auto.chat_template and "<|im_start|>" in remembered.chat_template
        assert _lengths(remembered, rows) == _lengths(auto, rows)
        assert min(_lengths(auto, rows)[1]) > 20  # the counts compared are real ones
        for template in (auto.chat_template, "{% for m in messages %}{{ m['content'] }}{% endfor", "{{ raise_exception('no system turn') }}"):
            assert _verdict(remembered, template) == _verdict(auto, template)
        assert _verdict(auto, "{% for m in messages %}{{ m['content'] }}{% endfor").startswith("--chat-template t.jinja: the chat template cannot render")
    assert _state(sft_checkpoint) == before  # nothing written into a model folder


def test_a_damaged_or_stale_entry_is_learned_again():
    from grtool.models import fact_file, recall
    from grtool.train.model import LORA_LAYERS, TOKENIZER_CLASS, LoraLayers, load_model_tokenizer, lora_layers, resolve

    ref = resolve(None)
    names, hidden = lora_layers(ref)
    assert hidden == 576 and "model.layers.0.self_attn.q_proj" in names and "model.layers.0.mlp" not in names
    entry = fact_file(ref.path, LORA_LAYERS)
    for damage in (b"", b"{", b'{"names": 3, "hidden_size": 576}', b"[]"):
        entry.write_bytes(damage)
        assert lora_layers(ref) == (names, hidden)
        assert recall(entry, LoraLayers) == LoraLayers(names, hidden)  # written anew
    entry = fact_file(ref.path, TOKENIZER_CLASS)
    for damage in (b"{", b'"transformers.nosuch:Tokenizer"', b'"os:system"', b'"transformers.tokenization_utils_tokenizers:nosuch"'):
        entry.write_bytes(damage)
        assert len(load_model_tokenizer(ref)) == 49152
        assert recall(entry, str) == "transformers.tokenization_utils_tokenizers:TokenizersBackend"


def test_a_dry_run_and_the_refusals_import_no_torch(sft_checkpoint, tmp_path, cli, tiny_model):
    """Each command runs where `import torch` exits 99: each exits with its own code and message. What only torch
    can tell (the tokenizer class, the LoRA layers, the checkpoint's check as a --model) was learned before, by
    the same dry runs with torch, whose reports the ones without it repeat exactly."""
    from grtool.models import resolve_model
    from grtool.store.locks import output_lock

    sft, kto = write_sft(tmp_path / "sft.json", n=16), write_kto(tmp_path / "kto.json", 4, 4)
    dry_runs = [("sft", sft, "--out", tmp_path / "ckpt", "--lora", "--lora-target", "q_proj,v_proj"),
                ("kto", kto, "--model", sft_checkpoint, "--out", tmp_path / "kto", *TINY)]  # fmt: skip
    learned = [orjson.loads(cli("train", *args, "--dry-run", "--json").stdout) for args in dry_runs]
    no_torch = without_torch(tmp_path / "stand-in")
    cli("train", "sft", sft, "--out", tmp_path / "real", "--max-steps", "1", *TINY, check=99, env=no_torch)  # training imports torch: the stand-in stops it
    for args, report in zip(dry_runs, learned):
        assert orjson.loads(cli("train", *args, "--dry-run", "--json", env=no_torch).stdout) == report
    assert learned[0]["steps"] == 8 and learned[1]["desirable"] == 4

    def refused(*args, code: int = 2) -> str:
        err = " ".join(cli("train", *args, check=code, env=no_torch).stderr.split())
        assert "Traceback" not in err and "error:" in err, err[-2000:]
        return err

    model = resolve_model(None).path
    for extra in (["--dry-run"], ["--overwrite"]):
        assert f"--out {model}: is the input {model}" in refused("sft", sft, "--out", model, *TINY, *extra)
        assert "no layer LoRA can adapt named mlp" in refused("sft", sft, "--out", tmp_path / "ckpt", "--lora", "--lora-target", "mlp", *extra)
    finished = finished_copy(sft_checkpoint, tmp_path / "finished")
    assert "holds a finished checkpoint" in refused("sft", sft, "--out", finished, *TINY)
    assert "holds a finished checkpoint" in refused("kto", kto, "--model", sft_checkpoint, "--out", finished, "--resume", *TINY)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("train kto\n")
    assert "already holds files" in refused("kto", kto, "--model", sft_checkpoint, "--out", notes, *TINY)
    interrupted = tmp_path / "interrupted"  # a run killed after its checkpoint-4, resumed with another learning rate
    interrupted.mkdir()
    shutil.copy(sft_checkpoint / "grtool-run.json", interrupted / "grtool-run.json")
    shutil.copytree(sft_checkpoint / "checkpoint-4", interrupted / "checkpoint-4", copy_function=os.symlink)
    err = refused("sft", sft, "--out", interrupted, "--resume", *shared_sft_args(tiny_model, {"--learning-rate": "3e-4"}))
    assert "--resume refused" in err and "learning-rate was 0.0001, now 0.0003" in err
    live = tmp_path / "live"  # a live run's folder (its run record written), and one it has not made yet
    live.mkdir()
    shutil.copy(sft_checkpoint / "grtool-run.json", live / "grtool-run.json")
    for out in (live, tmp_path / "not-yet"):
        with output_lock(out, command=["grtool", "pretend", "run"]):
            for extra in ([], ["--overwrite"], ["--resume"]):
                err = refused("sft", sft, "--out", out, "--max-steps", "1", *TINY, *extra, code=75)
                assert "is being written by another run" in err and f"pid {os.getpid()}" in err
    yaml = tmp_path / "sft.yaml"
    cli("train", "sft", sft, "--out", yaml, "--format", "llamafactory-yaml", env=no_torch)
    assert "model_name_or_path" in yaml.read_text()
