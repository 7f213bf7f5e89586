"""`grtool train sft|kto`: plan (data, model, configuration; checks, nothing written), then train with TRL.

A plan is built from the inputs and checked before anything is written: bad data, a model without a chat
template or an effective batch larger than the data stop here with a message naming the file (exit 2).
:func:`build_trainer` makes the TRL trainer (tests inspect its tokenized rows), :func:`train` runs it and saves
the checkpoint: full weights with the tokenizer (markers included) in ``out``, and with ``--lora`` the adapter
in ``out/adapter`` beside the merged weights, so ``--model out`` is always a complete model. Resumable
checkpoints are saved atomically (:func:`atomic_checkpoints`) and ``--resume`` continues from the newest complete
one (:func:`last_complete_checkpoint`).
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from grtool.errors import InputError
from grtool.vocab.provenance import CHECKPOINT_RECORD as PROVENANCE, RUN_RECORD, RunIdentity, RunRecord, checkpoint_flips, read_checkpoint, read_run_record
from grtool.extras import require
from grtool.models import ModelRef, read_config, safetensors_header
from grtool.log import activity, log, quiet_libraries
from grtool.train.config import TrainConfig, check_report_to_installed, effective_batch, planned_steps, report_to_names, world_size
from grtool.train.data import TrainData, load_kto, load_sft
from grtool.records import Report


@dataclass
class Plan:
    kind: str
    data: TrainData
    model: ModelRef
    out: Path
    cfg: TrainConfig
    resume: bool = False
    overwrite: bool = False
    weights: tuple[float, float] = (1.0, 1.0)  # KTO (desirable, undesirable)
    losses: list[tuple[int, float]] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return planned_steps(self.cfg, len(self.data.rows))

    def report(self) -> dict[str, Any]:
        counts = self.data.labels()
        out = {
            "kind": self.kind,
            "data": self.data.source,
            "data_format": self.data.fmt,
            "rows": len(self.data.rows),
            "model": self.model.name,
            "model_path": self.model.path,
            "out": str(self.out),
            "processes": world_size(),
            "effective_batch_size": effective_batch(self.cfg),
            "steps": self.steps,
            "config": self.cfg.as_dict(),
        }
        if self.kind == "kto":
            out["desirable"], out["undesirable"] = counts.get(True, 0), counts.get(False, 0)
            out["config"]["desirable_weight"], out["config"]["undesirable_weight"] = self.weights
        return out


def plan(
    kind: str,
    data: str | Path,
    model: str | None,
    out: str | Path,
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    check_out: bool = True,
    check_template: bool = True,
    writes_checkpoint: bool = True,
) -> Plan:
    """Everything checked, nothing written. ``writes_checkpoint=False``: ``out`` is a LLaMA-Factory YAML file."""
    from grtool.train.model import resolve

    if writes_checkpoint and check_out:  # training itself: TRL and peft
        require("train", f"train {kind}")
    elif check_template:  # --dry-run loads the tokenizer through transformers
        require("llm", f"train {kind} --dry-run")
    if writes_checkpoint:  # the loggers of a run on this machine (a LLaMA-Factory config may run elsewhere)
        check_report_to_installed(cfg.report_to)
        if cfg.deepspeed and check_out:  # a --dry-run may plan the run of another machine
            require_deepspeed()

    if kind == "sft":
        loaded = load_sft(data, corpus=cfg.corpus, system=cfg.system, markers=cfg.markers, cannot_answer=cfg.cannot_answer)
    else:
        loaded = load_kto(data, corpus=cfg.corpus, triples=cfg.triples, system=cfg.system, markers=cfg.markers, tau=cfg.tau, desirable=cfg.desirable,
                          cannot_answer=cfg.cannot_answer)  # fmt: skip
    batch = effective_batch(cfg)
    if batch > len(loaded.rows):
        raise InputError(
            f"{loaded.source}: {len(loaded.rows)} rows, fewer than one effective batch of {batch} "
            f"(per-device {cfg.per_device_batch_size} × accumulation {cfg.gradient_accumulation} × {world_size()} processes); "
            "lower --per-device-batch-size / --gradient-accumulation or give more data"
        )
    ref = resolve(model)
    read_checkpoint(ref.path)  # a base model that is a grtool checkpoint: its record is read at the end, so damage stops the run now
    # The refusals that need no model loaded come first: transformers and torch take seconds to import.
    if str(out) != "-":  # also for --dry-run: what the real run would refuse
        _check_paths(Path(out), *_inputs(ref, loaded.source, cfg), replace=writes_checkpoint and overwrite and not resume)
    compare_resumed = check_out and _is_main() and _check_out(Path(out), resume=resume, overwrite=overwrite)  # other ranks would see the directory rank 0 is already filling
    if writes_checkpoint:
        from grtool.train.config import check_cutoff
        from grtool.train.model import model_context

        check_cutoff(cfg, model_context(ref))
        if cfg.lora:
            from grtool.train.config import check_lora
            from grtool.train.model import lora_layers

            check_lora(cfg, *lora_layers(ref))
    if check_template:  # the tokenizer loads in a moment; a model without a chat template stops here
        from grtool.train.data import drop_long_prompts
        from grtool.train.model import load_tokenizer

        drop_long_prompts(loaded, load_tokenizer(ref, cfg.chat_template), cfg.cutoff_len)
        if batch > len(loaded.rows):
            raise InputError(
                f"{loaded.source}: {len(loaded.rows)} rows within --cutoff-len {cfg.cutoff_len}, fewer than one effective batch of {batch}; raise --cutoff-len, lower the batch or give more data"
            )
    result = Plan(kind, loaded, ref, Path(out), cfg, resume=resume, overwrite=overwrite)
    if kind == "kto":
        from grtool.export.kto import balancing_weights

        counts = loaded.labels()
        dw, uw = balancing_weights(counts.get(True, 0), counts.get(False, 0))
        result.weights = (cfg.desirable_weight if cfg.desirable_weight is not None else round(dw, 6),
                          cfg.undesirable_weight if cfg.undesirable_weight is not None else round(uw, 6))  # fmt: skip
    if compare_resumed:  # last: the KTO weights it compares come from the rows the tokenizer kept
        check_resume(result, read_run_record(result.out))
    return result


def require_deepspeed() -> None:
    import importlib.util

    from grtool.errors import MissingDependency

    if importlib.util.find_spec("deepspeed") is None:
        raise MissingDependency("--deepspeed", "deepspeed", "deepspeed")


def _inputs(model: ModelRef, data_source: str, cfg: TrainConfig) -> tuple[list[Any], list[Any]]:
    """``(inputs, directories inputs are found in)`` of a training run, for the rule that --out is none of them."""
    path = model.path if Path(model.path).exists() else None
    return [path, cfg.deepspeed, cfg.chat_template], [data_source, cfg.corpus, cfg.triples]


def _check_paths(out: Path, inputs: list[Any], holders: list[Any], *, replace: bool) -> None:
    """--out is not an input (the base model, the data, ...); --overwrite replaces only a grtool checkpoint."""
    from grtool.store.outputs import CHECKPOINT, check_replaceable, refuse_output_among_inputs

    refuse_output_among_inputs(out, inputs, holders)
    if replace:
        check_replaceable(out, CHECKPOINT)


def _check_out(out: Path, *, resume: bool, overwrite: bool) -> bool:
    """--out against what it holds: a live run there is a transient refusal (exit 75, naming it); a finished
    checkpoint is replaced only with --overwrite. True: --resume continues the run there, which :func:`check_resume`
    compares with this command."""
    from grtool.store.locks import output_lock

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return False
    with output_lock(out):  # exit 75 naming the live run, before any advice about the files it is writing
        pass
    finished = read_checkpoint(out)
    if finished is not None and (resume or not overwrite):
        raise InputError(
            f"--out {out}: holds a finished checkpoint ({finished.kind}, {finished.global_step} steps, {finished.finished}); "
            "--resume continues only an interrupted run: pass --overwrite (without --resume) to replace it, or choose another --out"
        )
    if not (resume or overwrite):
        raise InputError(f"--out {out}: already holds files; pass --resume to continue its last checkpoint or --overwrite to start over")
    return resume


# Settings a resumed run may change: how often it saves and logs, not what it learns.
RESUME_MAY_CHANGE = frozenset({"save_steps", "save_total_limit", "keep_checkpoints", "logging_steps", "report_to"})


def run_identity(p: Plan) -> RunIdentity:
    hyper = p.report()["config"]
    return RunIdentity(kind=f"train {p.kind}", data=p.data.source, data_sha256=p.data.sha256, data_fingerprint=p.data.fingerprint,
                       model=p.model.name, model_path=p.model.path, hyperparameters=hyper)  # fmt: skip


def check_resume(p: Plan, record: RunRecord | None) -> None:
    """--resume continues the run whose ``grtool-run.json`` is in --out only with the same command: another kind,
    model, data or setting would mix two runs into one checkpoint that records only the second (exit 2)."""
    from grtool.errors import printable

    out = p.out
    if record is None or record.train is None:
        if not checkpoints(out):
            raise InputError(f"--out {printable(out)}: --resume: it holds no training run of grtool (no {RUN_RECORD}, no checkpoint-N); choose another --out")
        log.warning("--resume: %s has no %s saying which command started it: the resumed run is not compared with it", printable(out), RUN_RECORD)
        _check_resumed_architecture(p)
        return
    was, now_ = record.train, run_identity(p)
    differences = []
    if was.kind != now_.kind:
        differences.append(f"the run is `{was.kind}`, this is `{now_.kind}`")
    if was.model != now_.model:
        differences.append(f"--model was {was.model}, now {now_.model}")
    if (was.data, was.data_sha256, was.data_fingerprint) != (now_.data, now_.data_sha256, now_.data_fingerprint):
        same_path = was.data == now_.data
        differences.append(f"the data {was.data} {'changed since' if same_path else 'was given, now ' + now_.data}")
    for key in sorted(set(was.hyperparameters) | set(now_.hyperparameters)):
        if key in RESUME_MAY_CHANGE:
            continue
        old, new = was.hyperparameters.get(key), now_.hyperparameters.get(key)
        if old != new:
            differences.append(f"{key.replace('_', '-')} was {old!r}, now {new!r}")
    if differences:
        raise InputError(
            f"--out {printable(out)}: --resume refused: this command differs from the run it would continue ({'; '.join(differences)}); resume with the same command, or start over with --overwrite"
        )
    _check_resumed_architecture(p)


# What a checkpoint's config.json shares with the model it was trained from; the vocabulary is left out (training
# adds the docid markers and resizes the embeddings).
_ARCHITECTURE_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size")


def _check_resumed_architecture(p: Plan) -> None:
    """The newest checkpoint-N in --out holds weights of the model this command trains (full weights or a LoRA
    adapter, as --lora says; the architecture of its config.json): otherwise the trainer fails on loading its state,
    a traceback after the run started."""
    from grtool.errors import printable

    found = checkpoints(p.out)
    if not found:
        return
    checkpoint = found[-1]
    adapter = (checkpoint / "adapter_config.json").is_file()
    if (checkpoint / "config.json").is_file() or adapter:
        if adapter != bool(p.cfg.lora):
            held, trains = ("a LoRA adapter", "full weights") if adapter else ("full weights", "a LoRA adapter")
            raise InputError(f"--out {printable(p.out)}: --resume refused: {checkpoint.name} holds {held}, this command trains {trains}; resume with the command that started the run")
    theirs, mine = read_config(checkpoint), read_config(p.model.path)
    if adapter or theirs is None or mine is None:
        return
    differences = [f"{key} {theirs.get(key)!r} there, {mine.get(key)!r} in {p.model.name}" for key in _ARCHITECTURE_KEYS if theirs.get(key) != mine.get(key)]
    if differences:
        raise InputError(
            f"--out {printable(p.out)}: --resume refused: {checkpoint.name} is of another architecture than the model this command trains "
            f"({'; '.join(differences)}); resume with the model that started the run, or start over with --overwrite"
        )


def _dtype(cfg: TrainConfig):
    import torch

    bf16 = cfg.bf16 if cfg.bf16 is not None else bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return bf16, (torch.bfloat16 if bf16 else torch.float32)


def _common_args(p: Plan) -> dict[str, Any]:
    cfg = p.cfg
    bf16, _ = _dtype(cfg)
    return dict(
        output_dir=str(p.out),
        learning_rate=cfg.lr,
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation,
        max_length=cfg.cutoff_len,
        warmup_steps=cfg.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps (transformers 5)
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps if cfg.max_steps is not None else -1,  # -1: the Trainer runs --epochs
        seed=cfg.seed,
        lr_scheduler_type=cfg.lr_scheduler,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        report_to=_report_to(cfg.report_to),
        deepspeed=cfg.deepspeed,
        bf16=bf16,
        disable_tqdm=True,  # progress is grtool's (a Rich bar or plain log lines)
        dataloader_num_workers=0,
        dataset_num_proc=None,
    )


def _report_to(value: str) -> str | list[str]:
    """--report-to as TrainingArguments takes it: a list of loggers, or the words none and all alone."""
    names = report_to_names(value)
    return "none" if not names else "all" if names == ["all"] else names


def _lora(p: Plan, model, tokenizer, added: list[str]):
    """The model with LoRA adapters; markers just added also get their embedding rows trained.

    TRL's fused LM head reads ``lm_head.weight`` directly, so peft's token wrappers (``trainable_token_indices``,
    ``modules_to_save``) on the head fail or are bypassed; instead the embedding matrix stays a plain parameter
    that requires grad, and a gradient mask keeps every row but the markers' at zero (zero gradient, zero Adam
    update, no weight decay by default). The rows end up in the merged weights of the checkpoint."""
    import torch
    from peft import LoraConfig, get_peft_model

    from grtool.train.model import marker_ids

    cfg = p.cfg
    target: Any = cfg.lora_target if cfg.lora_target == "all-linear" else [t.strip() for t in cfg.lora_target.split(",") if t.strip()]
    model = get_peft_model(model, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=target, task_type="CAUSAL_LM"))
    if added:
        ids = marker_ids(tokenizer)
        base = model.get_base_model()
        weights = {id(w): w for w in (base.get_input_embeddings().weight, getattr(base.get_output_embeddings(), "weight", None)) if w is not None}
        for weight in weights.values():
            mask = torch.zeros(weight.shape[0], 1, dtype=weight.dtype, device=weight.device)
            mask[ids] = 1
            weight.requires_grad_(True)
            weight.register_hook(lambda grad, mask=mask: grad * mask)
    return model


def build_trainer(p: Plan, callbacks: list | None = None):
    """The TRL trainer for the plan (model loaded, markers added, data tokenized); trains nothing yet."""
    import copy

    from datasets import Dataset

    from grtool.train.model import add_markers, load_model, load_tokenizer, resize_and_init

    import datasets
    import transformers

    datasets.disable_progress_bars()  # grtool reports progress itself
    transformers.utils.logging.disable_progress_bar()
    quiet_libraries()  # in a log: the libraries' warnings as grtool's stamped lines
    cfg = p.cfg
    tokenizer = load_tokenizer(p.model, cfg.chat_template)
    added = add_markers(tokenizer)
    _, dtype = _dtype(cfg)
    with activity(f"loading model {p.model.name}"):
        model = load_model(p.model, dtype)
    resize_and_init(model, tokenizer, added)
    if added:
        log.info("added %s as special tokens (ids %s), initialised from [ and ]", " ".join(added), [tokenizer.convert_tokens_to_ids(t) for t in added])
    if cfg.lora:
        model = _lora(p, model, tokenizer, added)
    dataset = Dataset.from_list(p.data.rows)
    callbacks = list(callbacks or [])
    if p.kind == "sft":
        from trl import SFTConfig, SFTTrainer

        # prompt/completion rows + completion_only_loss: the loss falls on the assistant turn only, whatever the
        # chat template (assistant_only_loss would need {% generation %} markers in it).
        args = SFTConfig(**_common_args(p), packing=cfg.packing, completion_only_loss=True)
        trainer = atomic_checkpoints(SFTTrainer)(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    else:
        from trl import KTOConfig, KTOTrainer

        args = KTOConfig(**_common_args(p), beta=cfg.beta, desirable_weight=p.weights[0], undesirable_weight=p.weights[1])
        # The reference model is the starting checkpoint (the SFT model), markers included; with LoRA the
        # trainer disables the adapter instead.
        ref_model = None if cfg.lora else copy.deepcopy(model)
        trainer = atomic_checkpoints(KTOTrainer)(model=model, ref_model=ref_model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # grtool's progress callback reports the loss
    return trainer


def train(p: Plan) -> dict[str, Any]:
    """Train and save; returns the provenance record written to ``out/grtool.json``."""
    from grtool import signals
    from grtool.store.partloop import one_part

    with signals.noted(hint=_resume_hint(p)):
        if not _is_main():  # the other ranks write into what the main process claimed and prepared
            return _train(p)
        return one_part([checkpoint_output(p)], lambda part: _train(p), overwrite=p.overwrite and not p.resume)


def _resume_hint(p: Plan) -> str:
    """How a stopped run goes on: with --resume (without it, the same command refuses the folder it filled)."""
    return "run the same command again to resume" if p.resume else "run the same command with --resume to continue"


def checkpoint_output(p: Plan) -> Any:
    """``out`` as the run's one output (:class:`grtool.store.partloop.InPlaceOutput`): locked for this run (a second
    run into it is refused, naming this one), with --overwrite cleared of only what a training run writes there,
    and the run recorded in it before the model loads."""
    from grtool.store.outputs import CHECKPOINT
    from grtool.store.partloop import InPlaceOutput

    inputs, holders = _inputs(p.model, p.data.source, p.cfg)
    return InPlaceOutput(p.out, CHECKPOINT, inputs=inputs, holders=holders, started=lambda claimed: _record_start(p, claimed))


def _record_start(p: Plan, claimed: Any) -> None:
    """What the run is (a killed run can still be started over with --overwrite, and --resume compares with it); a
    resumed run keeps the record of the command that started it."""
    if not (p.resume and (previous := read_run_record(p.out)) is not None and previous.train is not None):
        from grtool.invocation import current_command
        from grtool.secrets import redact_argv
        from grtool.store.records import now
        from grtool.store.records import atomic_write_bytes

        started = RunRecord(kind="checkpoint", started=now(), command=redact_argv(claimed.lock.command or current_command()), train=run_identity(p))
        p.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(p.out / RUN_RECORD, msgspec.json.format(msgspec.json.encode(started)) + b"\n")


def _train(p: Plan) -> dict[str, Any]:
    from grtool import signals
    from grtool.holds import hold
    from grtool.train.progress import NonFiniteTraining, StopOnNonFinite, StopWhenAsked, TrainProgress, check_finite

    hold("training")  # tests: a run that holds --out and has written its run record there
    resume_from = None
    if p.resume and p.out.is_dir():
        found = last_complete_checkpoint(p.out, remove_incomplete=_is_main())  # every rank picks the same one
        if found is None:
            log.info("--resume: no complete checkpoint in %s yet, starting from the beginning", p.out)
        else:
            resume_from = str(found)
            log.info("resuming from %s (%s)", found.name, found)
    started = time.time()
    progress = TrainProgress(f"train {p.kind}", p.losses)
    trainer = build_trainer(p, callbacks=[progress, StopWhenAsked(), StopOnNonFinite()])
    log.info(
        "%s: %d rows, effective batch %d (per-device %d × accumulation %d × %d processes), %d steps",
        p.data.source, len(p.data.rows), effective_batch(p.cfg), p.cfg.per_device_batch_size, p.cfg.gradient_accumulation, world_size(), p.steps,
    )  # fmt: skip
    # One process: a SIGTERM lets the step in progress finish and saves a checkpoint (StopWhenAsked), then the run
    # stops with the transient code; a second SIGTERM stops at once. Several processes stop at once (each rank gets
    # the signal at its own moment: a checkpoint they do not all reach together would hang them).
    ended = False
    try:
        with signals.deferred() if world_size() == 1 else contextlib.nullcontext():
            output = trainer.train(resume_from_checkpoint=resume_from)
        ended = True
    except (signals.Stopped, KeyboardInterrupt):
        _note_stop(p, trainer.state.global_step)
        raise
    except NonFiniteTraining as e:
        raise _diverged(p, e) from None
    finally:
        progress.close(failed=not ended)  # a run that raised never reached on_train_end, which closes it otherwise
    if signals.requested() is not None and trainer.state.global_step < trainer.state.max_steps:
        _note_stop(p, trainer.state.global_step)
        signals.stop_if_requested()
    try:
        check_finite(trainer.model)
    except NonFiniteTraining as e:
        raise _diverged(p, e) from None
    tokenizer = trainer.processing_class
    if p.cfg.lora:
        adapter = p.out / "adapter"
        trainer.model.save_pretrained(str(adapter))
        if trainer.is_world_process_zero():
            merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
            merged.save_pretrained(str(p.out))
            tokenizer.save_pretrained(str(p.out))
    else:
        trainer.save_model(str(p.out))
        if trainer.is_world_process_zero():
            tokenizer.save_pretrained(str(p.out))
    record = provenance(p, trainer, output, time.time() - started, resumed_from=resume_from)
    if trainer.is_world_process_zero():
        if not p.cfg.keep_checkpoints:
            # the trainer's own checkpoint-N folders only: a user's checkpoint-best-mine/ beside them is not grtool's
            for finished in [*checkpoints(p.out), p.out / STAGING]:
                shutil.rmtree(finished, ignore_errors=True)
        from grtool.store.records import atomic_write_bytes

        atomic_write_bytes(p.out / PROVENANCE, orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n")
    return record


def _diverged(p: Plan, e: Exception) -> Exception:
    """A run whose numbers stopped being finite: nothing of it was saved (exit 1)."""
    from grtool.errors import DataProblem
    from grtool.errors import printable

    found = last_complete_checkpoint(p.out, remove_incomplete=False) if p.out.is_dir() else None
    kept = f"; {found.name} (saved before) is the last complete checkpoint" if found is not None else ""
    return DataProblem(
        f"train {p.kind}: training diverged ({e}); nothing of it was saved in {printable(p.out)}{kept}: "
        f"lower --learning-rate (now {p.cfg.lr:g}){' or --beta' if p.kind == 'kto' else ''}, or check the base model's weights"
    )


def _note_stop(p: Plan, step: int) -> None:
    """What the line printed for a stopped run says: the step reached, the checkpoint a resume starts from."""
    from grtool import signals

    found = last_complete_checkpoint(p.out, remove_incomplete=False) if p.out.is_dir() and _is_main() else None
    kept = f"{found.name} is the last complete checkpoint in {p.out}" if found is not None else f"no complete checkpoint in {p.out} yet"
    signals.note(f"training stopped at step {step}; {kept}")


# ---- checkpoints: written under a temporary name, renamed to checkpoint-N once complete

STAGING = "incomplete-checkpoint"  # out/incomplete-checkpoint/checkpoint-N while it is being written
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def atomic_checkpoints(trainer_class: type) -> type:
    """``trainer_class`` (a transformers Trainer) saving each checkpoint atomically.

    The Trainer writes a checkpoint file by file into ``checkpoint-N``, trainer_state.json last: a kill during the
    save (SIGTERM from a scheduler, a preemption) left a folder under its final name that ``--resume`` then
    failed to load. Here the whole save goes to ``out/incomplete-checkpoint/checkpoint-N`` (the Trainer's own
    code, with its output folder moved for the duration of the save), and only the finished folder, synced to
    disk, is renamed to ``out/checkpoint-N``; then the old ones are rotated as the Trainer would."""

    class AtomicCheckpoints(trainer_class):
        _staging: str | None = None

        def _get_output_dir(self, trial):
            return self._staging or super()._get_output_dir(trial)

        def _save_checkpoint(self, model, trial):
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

            run_dir = Path(self._get_output_dir(trial))
            staging = run_dir / STAGING
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            if self.args.should_save:
                shutil.rmtree(staging, ignore_errors=True)  # a save cut short earlier
            from grtool.holds import hold
            from grtool.train.progress import check_finite

            check_finite(model)  # a checkpoint of non-finite weights could only be resumed into more of them
            self.accelerator.wait_for_everyone()
            self._staging = str(staging)
            try:
                super()._save_checkpoint(model, trial)
                hold("saving")  # tests: a checkpoint written in full under its temporary name, not yet committed
            except BaseException:  # a stop or an error mid-save: what was written can serve nothing
                if self.args.should_save:
                    shutil.rmtree(staging, ignore_errors=True)
                raise
            finally:
                self._staging = None
            self.accelerator.wait_for_everyone()  # every rank has written its part (RNG state, shards)
            if self.args.should_save:
                _commit_checkpoint(staging / name, run_dir / name)
                shutil.rmtree(staging, ignore_errors=True)
                rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                                   best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)  # fmt: skip
            self.accelerator.wait_for_everyone()

    AtomicCheckpoints.__name__ = AtomicCheckpoints.__qualname__ = f"Atomic{trainer_class.__name__}"
    return AtomicCheckpoints


def _commit_checkpoint(written: Path, final: Path) -> None:
    """fsync every file of a finished checkpoint folder, then rename it into place."""
    from grtool.store.records import _fsync_dir

    for folder, _, files in os.walk(written):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(folder))
    if final.exists():  # the same step saved again (after a resume from an earlier one)
        shutil.rmtree(final)
    os.replace(written, final)
    _fsync_dir(final.parent)


def checkpoint_problem(folder: Path) -> str | None:
    """What a resume from ``folder`` would miss, or None when it holds everything: the trainer state (the
    Trainer writes it last), the model weights whole, the optimizer and scheduler state."""
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "no trainer_state.json"
    try:
        orjson.loads(state.read_bytes())["global_step"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "trainer_state.json is cut short"
    subfolders = [d for d in folder.iterdir() if d.is_dir()]  # DeepSpeed (global_stepN) and FSDP keep their state there
    weights = [f for f in folder.iterdir() if f.is_file() and re.fullmatch(r"(adapter_model|model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)", f.name)]
    if not weights and not subfolders:
        return "no model weights"
    for index in folder.glob("*.index.json"):
        try:
            shards = set(orjson.loads(index.read_bytes())["weight_map"].values())
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return f"{index.name} is cut short"
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            return f"{index.name} names missing shards {', '.join(missing)}"
    for f in weights:
        if f.suffix == ".safetensors" and safetensors_header(f) is None:
            return f"{f.name} is cut short"
    for f in folder.iterdir():  # torch.save writes zip archives: a cut one has no central directory
        if f.is_file() and f.suffix in (".pt", ".pth", ".bin") and not zipfile.is_zipfile(f):
            return f"{f.name} is cut short"
    has_optimizer = any((folder / n).is_file() for n in ("optimizer.pt", "optimizer.bin")) or subfolders
    if not has_optimizer:
        return "no optimizer state (optimizer.pt)"
    if (folder / "optimizer.pt").is_file() and not (folder / "scheduler.pt").is_file():
        return "no scheduler state (scheduler.pt)"
    return None


def checkpoints(out: Path) -> list[Path]:
    """The trainer's ``checkpoint-N`` folders in ``out``, oldest step first (a user's ``checkpoint-best-mine/`` is none)."""
    found = sorted((int(m[1]), d) for d in out.iterdir() if d.is_dir() and (m := _CHECKPOINT.fullmatch(d.name)))
    return [d for _, d in found]


def last_complete_checkpoint(out: Path, remove_incomplete: bool = True) -> Path | None:
    """The newest ``checkpoint-N`` in ``out`` that a resume can load. A save cut short (the temporary folder, or a
    checkpoint-N missing files as versions before atomic saves left it after a kill) is skipped with a message,
    and removed when ``remove_incomplete`` (rank 0): it can serve nothing, and would confuse the rotation."""
    staging = out / STAGING
    if staging.exists() and remove_incomplete:
        log.warning("--resume: removing %s, a checkpoint save that was cut short", staging)
        shutil.rmtree(staging, ignore_errors=True)
    for folder in reversed(checkpoints(out)):
        try:
            problem = checkpoint_problem(folder)
        except OSError as e:  # unreadable, or removed by rank 0 meanwhile
            problem = str(e)
        if problem is None:
            return folder
        if remove_incomplete:
            log.warning("--resume: %s is incomplete (%s), a save cut short: removed, resuming from an earlier one", folder, problem)
            shutil.rmtree(folder, ignore_errors=True)
    return None


def _is_main() -> bool:
    from grtool.userinput import env

    return env("RANK") == 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def provenance(p: Plan, trainer, output, seconds: float, resumed_from: str | None = None) -> dict[str, Any]:
    import datetime as dt

    from grtool import __version__
    from grtool.evaluation.overlap import trained_questions
    from grtool.invocation import current_command
    from grtool.train.model import marker_ids

    report = p.report()
    return {
        "kind": f"train {p.kind}",
        "command": current_command(),
        "versions": {
            "grtool": __version__,
            "trl": _version("trl"),
            "peft": _version("peft"),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "python": platform.python_version(),
        },  # fmt: skip
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "data": {
            "source": p.data.source,
            "format": p.data.fmt,
            "rows": len(p.data.rows),
            "sha256": p.data.sha256,
            "fingerprint": p.data.fingerprint,
            **({"desirable": report["desirable"], "undesirable": report["undesirable"]} if p.kind == "kto" else {}),
        },  # fmt: skip
        "base_model": {"name": p.model.name, "path": p.model.path},
        "questions": trained_questions(p.data.source, p.data.questions, p.model.path),  # what `eval recall` must not score
        "flips": learned_flips(p),
        "hyperparameters": report["config"],
        "processes": world_size(),
        "effective_batch_size": report["effective_batch_size"],
        "global_step": trainer.state.global_step,
        "resumed_from": resumed_from,
        "train_loss": _finite(getattr(output, "training_loss", None)),
        "first_loss": p.losses[0][1] if p.losses else None,
        "final_loss": p.losses[-1][1] if p.losses else None,
        "losses": [{"step": s, "loss": v} for s, v in p.losses],
        "markers": dict(zip(("docid_start", "docid_end"), marker_ids(trainer.processing_class))),
        "adapter": str(p.out / "adapter") if p.cfg.lora else None,
        "seconds": round(seconds, 1),
    }


def learned_flips(p: Plan) -> bool | None:
    """Whether the model learned tail-first docids: its data has flipped ones, or its base model (a grtool
    checkpoint, e.g. SFT before KTO) did. None when neither is known. `retrieve` refuses an index without
    ``--flips`` for such a model (:func:`checkpoint_flips`)."""
    from grtool.train.data import data_flips

    data = data_flips(p.data.source)
    return True if checkpoint_flips(p.model.path) else data


def _finite(x: float | None) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class TrainPlanReport(Report, kw_only=True):
    """``train sft|kto --dry-run --json``: :meth:`Plan.report` (what a run would do). A run's ``--json`` prints
    the checkpoint's record instead (:class:`grtool.vocab.provenance.CheckpointRecord`)."""

    kind: str
    data: str
    data_format: str
    rows: int
    model: str
    model_path: str
    out: str
    processes: int
    effective_batch_size: int
    steps: int
    config: dict[str, Any]
    desirable: int | msgspec.UnsetType = msgspec.UNSET
    undesirable: int | msgspec.UnsetType = msgspec.UNSET
