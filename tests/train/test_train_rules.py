"""Checkpoints and training runs are held to the rules every command keeps (DESIGN §8): --resume continues only the
run its command started, a finished checkpoint is replaced only with --overwrite, numbers are finite and in range
before anything loads, a file is trained by the command its export record names, a live run's folder is a
transient refusal, a diverging run saves nothing. Each refusal is one line, exit 2 (1 for data, 75 for a live run).

The session's shared SFT checkpoint (tests/conftest.py: 4 steps, 16 rows, its checkpoint-4 kept) serves every test
that needs a finished checkpoint; the others stop before the model loads.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest

from train_helpers import SHARED_SFT_ROWS, finished_copy, shared_sft_args, write_kto, write_sft

pytestmark = pytest.mark.slow

TINY = ["--cutoff-len", "128", "--per-device-batch-size", "2", "--warmup-ratio", "0", "--learning-rate", "1e-4"]


def one_line(proc, *words: str) -> str:
    err = " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert all(w in err for w in words), err[-2000:]
    return err


@pytest.fixture
def finished(sft_checkpoint):
    """The shared finished checkpoint: the model of the resume tests (read only; refusals get a copy)."""
    return sft_checkpoint


def test_the_checkpoint_records_decode_through_their_declarations(finished, tmp_path, cli):
    from grtool.vocab.provenance import read_checkpoint, read_run_record
    from grtool.records import DamagedRecord

    record = read_checkpoint(finished)
    assert record.kind == "train sft" and record.global_step == 4 and record.data.rows == SHARED_SFT_ROWS
    run = read_run_record(finished)
    assert run.train is not None and run.train.kind == "train sft" and run.train.hyperparameters["learning_rate"] == 1e-4
    assert read_checkpoint(tmp_path) is None  # not a checkpoint
    # a damaged record is a damaged record (exit 1 naming the field), never "not a grtool checkpoint"
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in finished.iterdir():
        if f.is_file():
            (damaged / f.name).symlink_to(f)
    (damaged / "grtool.json").unlink()
    (damaged / "grtool.json").write_bytes(orjson.dumps({**orjson.loads((finished / "grtool.json").read_bytes()), "global_step": -1}))
    with pytest.raises(DamagedRecord, match="global_step"):
        read_checkpoint(damaged)
    kto = write_kto(tmp_path / "kto.json", 2, 2)
    one_line(cli("train", "kto", kto, "--model", damaged, "--out", tmp_path / "kto", *TINY, check=1), "grtool.json", "field global_step")
    assert not (tmp_path / "kto").exists()


def test_resume_into_a_finished_checkpoint_is_refused(finished, tmp_path, cli):
    """`train kto --resume --out SFT` trained and replaced the finished SFT model (exit 0, no --overwrite)."""
    finished = finished_copy(finished, tmp_path / "finished")
    before = (finished / "grtool.json").read_bytes()
    kto = write_kto(tmp_path / "kto.json", 2, 2)
    one_line(cli("train", "kto", kto, "--resume", "--out", finished, *TINY, check=2), "holds a finished checkpoint", "--overwrite")
    sft = write_sft(tmp_path / "sft.json", n=4)
    one_line(cli("train", "sft", sft, "--resume", "--out", finished, *TINY, check=2), "holds a finished checkpoint")
    assert (finished / "grtool.json").read_bytes() == before and (finished / "model.safetensors").is_file()


@pytest.fixture
def interrupted(finished, tmp_path):
    """A run stopped after its checkpoint-4, as a kill leaves it: the run record and the checkpoint, no grtool.json."""
    out = tmp_path / "interrupted"
    out.mkdir()
    shutil.copy(finished / "grtool-run.json", out / "grtool-run.json")
    (out / "checkpoint-4").mkdir()
    for f in (finished / "checkpoint-4").iterdir():
        (out / "checkpoint-4" / f.name).symlink_to(f)
    return out


def test_resume_refuses_a_command_that_differs(finished, interrupted, tmp_path, cli, tiny_model):
    """Another learning rate, cutoff, data file, model or kind was mixed into the resumed run silently, and
    grtool.json then recorded only the new values."""
    data = Path(orjson.loads((finished / "grtool.json").read_bytes())["data"]["source"])
    resume = ["--out", interrupted, "--resume"]
    one_line(cli("train", "sft", data, *resume, *shared_sft_args(tiny_model, {"--learning-rate": "3e-4"}), check=2), "--resume refused", "learning-rate was 0.0001, now 0.0003")
    one_line(cli("train", "sft", data, *resume, *shared_sft_args(tiny_model, {"--cutoff-len": "128"}), check=2), "cutoff-len was 256, now 128")
    other = write_sft(tmp_path / "other.json", n=6)
    one_line(cli("train", "sft", other, *resume, *shared_sft_args(tiny_model), check=2), "--resume refused", f"the data {data} was given, now {other}")
    one_line(cli("train", "sft", data, *resume, *shared_sft_args(finished), check=2), "--resume refused", f"--model was {tiny_model}")
    kto = write_kto(tmp_path / "kto.json", 2, 2)
    one_line(cli("train", "kto", kto, *resume, *TINY, check=2), "the run is `train sft`, this is `train kto`")
    assert sorted(p.name for p in interrupted.iterdir()) == ["checkpoint-4", "grtool-run.json"]  # nothing written


def test_resume_refuses_a_checkpoint_of_another_architecture(finished, interrupted, tmp_path, cli, tiny_model):
    """A checkpoint-N of another model (no run record to compare: a folder from elsewhere, or an older grtool) was
    handed to the trainer, which failed loading its state dict with a traceback after the run had started."""
    data = Path(orjson.loads((finished / "grtool.json").read_bytes())["data"]["source"])
    (interrupted / "grtool-run.json").unlink()
    config = interrupted / "checkpoint-4" / "config.json"
    other = {**orjson.loads(config.read_bytes()), "model_type": "bert", "hidden_size": 768}
    config.unlink()
    config.write_bytes(orjson.dumps(other))
    resume = ["--model", tiny_model, "--out", interrupted, "--resume", "--max-steps", "1", *TINY]  # the model it was trained from
    err = one_line(cli("train", "sft", data, *resume, check=2), "--resume refused", "checkpoint-4 is of another architecture", "model_type 'bert' there, 'llama'", "hidden_size 768 there")
    assert f"{tiny_model}@" in err  # the model this command trains, named
    one_line(cli("train", "sft", data, *resume, "--lora", check=2), "checkpoint-4 holds full weights, this command trains a LoRA adapter")
    assert sorted(p.name for p in interrupted.iterdir()) == ["checkpoint-4"] and (interrupted / "checkpoint-4" / "trainer_state.json").exists()


def test_resume_with_the_same_command_passes_the_check(finished, interrupted, tiny_model):
    """The comparison itself (no second training run here: tests/train/test_train.py resumes for real)."""
    from grtool.train.config import resolve
    from grtool.train.run import plan

    data = orjson.loads((finished / "grtool.json").read_bytes())["data"]["source"]
    options = {"max_steps": 4, "save_steps": 4, "keep_checkpoints": True, "cutoff_len": 256, "per_device_batch_size": 2, "warmup_ratio": 0.0, "learning_rate": 1e-4}
    plan("sft", data, str(tiny_model), interrupted, resolve("sft", options), resume=True)
    with pytest.raises(Exception, match="--resume refused"):
        plan("sft", data, str(tiny_model), interrupted, resolve("sft", {**options, "seed": 7}), resume=True)


@pytest.mark.parametrize(
    "kind, option, value, accepted",
    [
        ("sft", "--learning-rate", "inf", "finite number > 0"),
        ("sft", "--learning-rate", "nan", "finite number > 0"),
        ("sft", "--learning-rate", "-1e-5", "finite number > 0"),
        ("kto", "--beta", "nan", "finite number > 0"),
        ("kto", "--beta", "inf", "finite number > 0"),
        ("kto", "--desirable-weight", "nan", "finite number > 0"),
        ("sft", "--max-steps", "0", "whole number from 1"),
        ("sft", "--max-steps", "-3", "whole number from 1"),
        ("sft", "--seed", str(10**23), "whole number from 0 to 4294967295"),
        ("sft", "--seed", "-1", "whole number from 0"),
        ("sft", "--epochs", "inf", "finite number of passes"),
        ("sft", "--warmup-ratio", "nan", "[0, 1)"),
        ("sft", "--save-steps", str(10**23), "whole number from 1 to"),
        ("sft", "--cutoff-len", "100000", "longer than the model's context of 8192"),
    ],
)
def test_numbers_are_finite_and_in_range_before_anything_loads(kind, option, value, accepted, tmp_path, cli):
    data = write_sft(tmp_path / "sft.json", n=4) if kind == "sft" else write_kto(tmp_path / "kto.json", 2, 2)
    err = one_line(cli("train", kind, data, "--out", tmp_path / "ckpt", f"{option}={value}", check=2), option)
    # the option's parser (finite, its coarse range) or the training settings' check (the exact range) refuses it
    assert "expected a" in err or ("accepted is" in err and accepted in err), err
    assert not (tmp_path / "ckpt").exists()


def test_config_file_numbers_are_held_to_the_same_bounds(tmp_path, cli):
    data = write_sft(tmp_path / "sft.json", n=4)
    conf = tmp_path / "train.yaml"
    conf.write_text("learning_rate: .nan\n")
    one_line(cli("train", "sft", data, "--out", tmp_path / "ckpt", "--config", conf, check=2), "--learning-rate nan", "accepted is")


def test_train_sft_refuses_a_kto_export(tmp_path, cli):
    """`train sft` trained on a KTO export, its undesirable answers too."""
    from grtool.vocab.provenance import write_sidecar

    kto = write_kto(tmp_path / "thinkgr_kto.json", 2, 2)
    one_line(cli("train", "sft", kto, "--out", tmp_path / "ckpt", check=2), "carries a KTO label")  # the rows say so
    write_sidecar(kto, kind="kto", fmt="llamafactory", rows=4, json_array=True, inputs=[])
    one_line(cli("train", "sft", kto, "--out", tmp_path / "ckpt", check=2), "thinkgr_kto.json.grtool.json says `export kto` wrote it", "train kto")  # and the record
    sft = write_sft(tmp_path / "thinkgr_sft.json", n=4)
    write_sidecar(sft, kind="sft", fmt="llamafactory-sharegpt", rows=4, json_array=True, inputs=[])
    one_line(cli("train", "kto", sft, "--out", tmp_path / "ckpt", check=2), "says `export sft` wrote it")
    assert not (tmp_path / "ckpt").exists()


def test_a_second_run_into_a_live_runs_folder_exits_75(tmp_path, cli):
    """Today: exit 2 suggesting --overwrite, as if the live run's files were a finished run's."""
    data = write_sft(tmp_path / "sft.json", n=4)
    out, holds = tmp_path / "ckpt", tmp_path / "holds"
    holds.mkdir()
    first = subprocess.Popen([sys.executable, "-m", "grtool", "train", "sft", str(data), "--out", str(out), "--max-steps", "1", *TINY],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "GRTOOL_HOLD": f"training:{holds}"})  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (holds / "training.reached").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read().decode()[-3000:] if first.poll() is not None else "no hold"
            time.sleep(0.05)
        assert (out / "grtool-run.json").is_file()
        for extra in ([], ["--overwrite"], ["--resume"]):
            err = one_line(cli("train", "sft", data, "--out", out, "--max-steps", "1", *TINY, *extra, check=75), "is being written by another run")
            assert str(first.pid) in err and "--overwrite" not in err.split("is being written")[1]
    finally:
        first.send_signal(signal.SIGTERM)
        (holds / "training.release").touch()
        first.wait(120)


def test_a_diverging_run_stops_with_exit_1_and_saves_nothing(tmp_path, cli, tiny_model):
    """A base model whose final norm is NaN: every loss is NaN. The run stops at the first logged loss (before:
    it saved the non-finite weights, which then wrote end-of-text only, exit 0)."""
    from checkpoint_records import nan_model

    broken = nan_model(tmp_path / "nan-model", tiny_model)
    data = write_sft(tmp_path / "sft.json", n=4)
    out = tmp_path / "ckpt"
    err = one_line(cli("train", "sft", data, "--model", broken, "--out", out, "--max-steps", "2", "--save-steps", "1", *TINY, check=1),
                   "training diverged", "nothing of it was saved")  # fmt: skip
    assert "nan" in err.lower()
    assert not (out / "grtool.json").exists() and not (out / "model.safetensors").exists() and not list(out.glob("checkpoint-*"))
    # run in this process (tests/inprocess_helpers.py): the progress line's thread ended with the run (it used to
    # outlive a run that raised, printing "still running" through a pipeline's later stages)
    assert not [t for t in threading.enumerate() if t.name == "grtool-progress"]


def test_more_inputs_refused_before_anything_loads(tmp_path, cli):
    """Found trying more cases of the same kinds: each was a traceback (exit 1) after the run had started."""
    data = write_sft(tmp_path / "sft.json", n=4)
    out = tmp_path / "ckpt"
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"\x00" * 1000)
    one_line(cli("train", "sft", data, "--out", out, "--model", fake, "--dry-run", check=2), "not a GGUF file")
    deepspeed = tmp_path / "ds.json"
    deepspeed.write_text("{bad")
    one_line(cli("train", "sft", data, "--out", out, "--deepspeed", deepspeed, check=2), "--deepspeed", "not a JSON DeepSpeed config")
    one_line(cli("train", "sft", data, "--out", out, "--lora", "--lora-target", "nosuchmodule,q_proj", check=2), "no layer LoRA can adapt named nosuchmodule")
    err = one_line(cli("train", "sft", data, "--out", out, "--effective-batch-size", str(10**23), check=2), "--effective-batch-size")
    assert "expected an integer" in err or "accepted is" in err, err
    assert not out.exists()
