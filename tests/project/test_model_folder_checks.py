"""A model folder is checked when it is loaded: each defect one line naming it, exit 2, never a traceback.

Damaged copies of the small model's folder (the converted SmolLM2 in grtool's cache); no training runs here:
`train sft --dry-run` loads the tokenizer only, `retrieve` stops before its model loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from train_helpers import write_sft


@pytest.fixture(scope="module")
def model_folder():
    from grtool.models import resolve_model

    return Path(resolve_model(None).path)


def damaged_copy(model_folder: Path, where: Path) -> Path:
    """The small model's files, the weights linked (read only, never written), the rest copied."""
    where.mkdir(parents=True)
    for f in model_folder.iterdir():
        if f.suffix == ".safetensors":
            (where / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy(f, where / f.name)
    return where


def refused(proc, *words: str) -> str:
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "install" not in proc.stderr, proc.stderr[-3000:]
    assert all(w in err for w in words), err[-2000:]
    return err


def dry_run(cli, tmp_path: Path, model: Path | str, *extra, check=2, env=None):
    data = write_sft(tmp_path / "sft.json", n=4)
    return cli("train", "sft", data, "--model", model, "--out", tmp_path / "ckpt", "--dry-run", *extra, check=check, env=env)


def test_truncated_weights(model_folder, tmp_path, cli):
    bad = damaged_copy(model_folder, tmp_path / "model")
    (bad / "model.safetensors").unlink()
    (bad / "model.safetensors").write_bytes((model_folder / "model.safetensors").read_bytes()[: 1 << 20])
    refused(dry_run(cli, tmp_path, bad), "model.safetensors is cut short")


def test_truncated_weights_in_the_converted_model_cache(model_folder, tmp_path, cli):
    """grtool's own converted copy of the default model: the message says how to convert it again."""
    cache = tmp_path / "cache"
    bad = damaged_copy(model_folder, cache / "models" / model_folder.name)
    (bad / "model.safetensors").unlink()
    (bad / "model.safetensors").write_bytes((model_folder / "model.safetensors").read_bytes()[: 1 << 20])
    data = write_sft(tmp_path / "sft.json", n=4)
    proc = cli("train", "sft", data, "--out", tmp_path / "ckpt", "--dry-run", check=2, env={"GRTOOL_CACHE": str(cache)})
    refused(proc, "model.safetensors is cut short", f"delete {bad}")


def test_a_folder_that_passed_is_checked_again_only_when_its_files_change(model_folder, tmp_path):
    """A folder that passed (a user's, or grtool's converted copy) is remembered in grtool's cache with its files'
    signature, so later commands skip the check (it imports torch: seconds before any refusal); nothing is written
    into the folder; a file changed since is checked again."""
    from grtool.errors import InputError
    from grtool.models import MODEL_CHECKED, check_model_folder, fact_file, recall

    for copy, converted in ((damaged_copy(model_folder, tmp_path / "mine"), False), (damaged_copy(model_folder, tmp_path / "models" / model_folder.name), True)):
        before = sorted(p.name for p in copy.iterdir())
        fact_file(copy, MODEL_CHECKED).unlink(missing_ok=True)
        check_model_folder(copy, cache=converted)
        assert recall(fact_file(copy, MODEL_CHECKED), bool) is True and sorted(p.name for p in copy.iterdir()) == before
        (copy / "config.json").write_text("{")
        with pytest.raises(InputError, match=r"config.json is not valid JSON" + (".*converted again" if converted else "")):
            check_model_folder(copy, cache=converted)


def test_config_of_another_architecture(model_folder, tmp_path, cli):
    """A config.json whose architecture loads none of the weights: transformers would start every one at random
    (it generated noise with exit 0)."""
    bad = damaged_copy(model_folder, tmp_path / "model")
    config = orjson.loads((bad / "config.json").read_bytes())
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config["vocab_size"], "n_embd": 64, "n_layer": 2, "n_head": 2,
            "n_positions": 1024}  # fmt: skip
    (bad / "config.json").write_bytes(orjson.dumps(gpt2))
    refused(dry_run(cli, tmp_path, bad), "GPT2LMHeadModel", "loads none of the")
    config["num_hidden_layers"] += 2  # the same architecture with layers the weights lack
    (bad / "config.json").write_bytes(orjson.dumps(config))
    refused(dry_run(cli, tmp_path, bad), "the weights lack")


def test_vocabulary_larger_than_the_embedding(model_folder, tmp_path, cli):
    bad = damaged_copy(model_folder, tmp_path / "model")
    tokenizer = orjson.loads((bad / "tokenizer.json").read_bytes())
    vocab = tokenizer["model"]["vocab"]
    config = orjson.loads((bad / "config.json").read_bytes())
    for i in range(config["vocab_size"] - len(vocab) + 10):
        vocab[f"extra{i}"] = len(vocab)
    (bad / "tokenizer.json").write_bytes(orjson.dumps(tokenizer))
    refused(dry_run(cli, tmp_path, bad), "tokens but the embedding has", f"{config['vocab_size']} rows")


def test_index_or_empty_folder_as_model(tmp_path, cli):
    index = tmp_path / "index"
    index.mkdir()
    (index / "index.json").write_text('{"format": "grtool-index/1"}')
    refused(dry_run(cli, tmp_path, index), "is a grtool index, not a model")
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(dry_run(cli, tmp_path, empty), "has no config.json")


def test_damaged_tokenizer_files(model_folder, tmp_path, cli):
    bad = damaged_copy(model_folder, tmp_path / "model")
    (bad / "tokenizer_config.json").write_text("[garbage")
    refused(dry_run(cli, tmp_path, bad), "tokenizer_config.json is not valid JSON")


def test_no_tokenizer_never_advises_sentencepiece(model_folder, tmp_path, cli):
    bad = damaged_copy(model_folder, tmp_path / "model")
    (bad / "tokenizer.json").unlink()
    refused(dry_run(cli, tmp_path, bad), "has no tokenizer")


def test_invalid_chat_template(tmp_path, cli):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for message in messages %}{{ message['content'] }\n")
    refused(dry_run(cli, tmp_path, "SmolLM2-135M-Instruct", "--chat-template", broken), f"--chat-template {broken}", "chat template cannot render")
    raising = tmp_path / "raising.jinja"
    raising.write_text("{{ raise_exception('no system role') }}")
    refused(dry_run(cli, tmp_path, "SmolLM2-135M-Instruct", "--chat-template", raising), "no system role")


def test_garbage_adapter(tmp_path, cli):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("not json")
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 100)
    proc = cli("retrieve", tmp_path / "run", "--index", tmp_path / "index", "--adapter", adapter, "--out", tmp_path / "responses", check=2)
    refused(proc, f"--adapter {adapter}", "adapter_config.json is not valid JSON")
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    proc = cli("retrieve", tmp_path / "run", "--index", tmp_path / "index", "--adapter", adapter, "--out", tmp_path / "responses", check=2)
    refused(proc, "adapter_model.safetensors is cut short")
    assert not (tmp_path / "responses").exists()
