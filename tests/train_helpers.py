"""Training data for the train tests: small SFT and KTO files about a few people's birthplaces."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson
from grtool.export.formats import dataset_info_stanza, kto_row, sft_row, update_dataset_info
from grtool.index.tokenizer import DOCID_END, DOCID_START
from grtool.vocab.prompt import instruction


PEOPLE = [("Ada Lovelace", "London", "England"), ("Marie Curie", "Warsaw", "Poland"), ("Alan Turing", "Maida Vale", "England"),
          ("Niels Bohr", "Copenhagen", "Denmark"), ("Emmy Noether", "Erlangen", "Germany"), ("Enrico Fermi", "Rome", "Italy"),
          ("Lise Meitner", "Vienna", "Austria"), ("Paul Dirac", "Bristol", "England")]  # fmt: skip


def question(i: int) -> str:
    person = PEOPLE[i % len(PEOPLE)][0]
    return f"In which country is the birthplace of {person}?" if i < len(PEOPLE) else f"Which country holds the city where {person} was born?"


def chain(i: int, good: bool = True) -> str:
    person, city, country = PEOPLE[i % len(PEOPLE)]
    first = f"{DOCID_START}{person}, place of birth, {city}{DOCID_END}"
    if not good:
        return f"{first} The triples do not say where {city} is, so the question cannot be answered."
    return f"{person} was born in {first}. {city} lies in {DOCID_START}{city}, country, {country}{DOCID_END}. So the answer is {country}."


def write_sft(path: Path, n: int = 16, fmt: str = "llamafactory-sharegpt") -> Path:
    """Rows exactly as `export sft` writes them, registered in dataset_info.json like it does."""
    rows = [sft_row(fmt, instruction(question(i)), chain(i), None) for i in range(n)]
    if fmt.startswith("llamafactory"):
        path.write_bytes(orjson.dumps(rows))
        update_dataset_info(path.parent, {path.stem: dataset_info_stanza(fmt, path.name, system=False)})
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def write_kto(path: Path, desirable: int = 8, undesirable: int = 8, fmt: str = "llamafactory") -> Path:
    rows = [kto_row(fmt, instruction(question(i)), chain(i, True), True, None) for i in range(desirable)]
    rows += [kto_row(fmt, instruction(question(i)), chain(i, False), False, None) for i in range(undesirable)]
    if fmt == "llamafactory":
        path.write_bytes(orjson.dumps(rows))
        update_dataset_info(path.parent, {path.stem: dataset_info_stanza("llamafactory-sharegpt", path.name, system=False, kto=True)})
    else:
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


# One real SFT run of the tiny model (below) serves every test that reads a finished checkpoint, resumes from its
# checkpoint-4, or must be refused against it: 16 rows, 4 steps, the one save at step 4 kept (its optimizer state:
# what --resume needs).
SHARED_SFT_ROWS = 16
SHARED_SFT_SETTINGS = {"--max-steps": "4", "--save-steps": "4", "--learning-rate": "1e-4", "--warmup-ratio": "0", "--cutoff-len": "256",
                       "--per-device-batch-size": "2"}  # fmt: skip
SHARED_SFT_FOLDER = "shared-sft-checkpoint"


def shared_sft_args(model: Path, changed: dict[str, str] | None = None) -> list[str]:
    """The shared run's options (``changed`` replaces some) with ``--model``: the command a --resume of it must
    repeat (the shared run's model is the tiny one)."""
    settings = {"--model": str(model), **SHARED_SFT_SETTINGS, **(changed or {})}
    return [*(x for kv in settings.items() for x in kv), "--keep-checkpoints"]


def shared_root(tmp_path_factory) -> Path:
    """The folder every xdist worker of this session sees (each worker's basetemp is a subfolder of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_sft_checkpoint(tmp_path_factory) -> Path:
    """The shared SFT checkpoint, trained by whichever worker asks first while the others wait on the lock."""
    from filelock import FileLock

    from conftest import run_cli

    root = shared_root(tmp_path_factory) / SHARED_SFT_FOLDER
    ckpt = root / "ckpt"
    root.mkdir(exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if not (ckpt / "grtool.json").is_file():
            shutil.rmtree(ckpt, ignore_errors=True)  # a worker that failed mid-run: train again
            data = write_sft(root / "thinkgr_sft.json", n=SHARED_SFT_ROWS)
            run_cli("train", "sft", data, "--out", ckpt, *shared_sft_args(tiny_model(tmp_path_factory)))
    return ckpt


TINY_MODEL_FOLDER = "tiny-random-smollm2"


def tiny_model(tmp_path_factory) -> Path:
    """A model folder with the embedded SmolLM2's tokenizer, chat template and architecture (Llama) at a size that
    trains in a fraction of a second a step: 2 layers of width 64, random weights from seed 0 (what transformers' and
    TRL's own test suites train). For the tests of the training machinery (checkpoints, resume, signals, LoRA, KTO,
    refusals) whose assertions do not depend on what the model knows; what training teaches is tested on the real
    model (tests/train/test_train_memorization.py). Made once per session, shared by the xdist workers."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory) / TINY_MODEL_FOLDER
    with FileLock(str(root) + ".lock"):
        if not (root / "model.safetensors").is_file():
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            from grtool.models import resolve_model

            source = Path(resolve_model(None).path)
            staging = root.with_name(root.name + ".tmp")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
                shutil.copy(source / name, staging / name)
            config = AutoConfig.from_pretrained(source)
            config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})
            with torch.random.fork_rng():  # the worker's own random state is left as it was
                torch.manual_seed(0)
                AutoModelForCausalLM.from_config(config).save_pretrained(staging)
            os.replace(staging, root)
    return root


def finished_copy(ckpt: Path, target: Path) -> Path:
    """The finished checkpoint's own files (not its checkpoint-N folder), copied: for a test whose command must leave
    the folder alone, so that a broken refusal writes into the test's copy, never into the shared checkpoint."""
    shutil.copytree(ckpt, target, ignore=shutil.ignore_patterns("checkpoint-*"))
    return target
