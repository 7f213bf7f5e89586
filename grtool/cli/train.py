"""`grtool train sft|kto`: SFT then KTO on TRL (options only; the logic is in grtool.train)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from grtool.cli.commands import Command, Group, PathKind, TableInput, register
from grtool.cli.options import CannotAnswer, Json, Overwrite, print_report

register(Group("train", "Train a retriever: SFT on the exported chains, then KTO on labelled samples (TRL)."))


class Preset(str, Enum):
    thinkgr = "thinkgr"


class OutFormat(str, Enum):
    checkpoint = "checkpoint"
    llamafactory_yaml = "llamafactory-yaml"


class Desirable(str, Enum):  # as `export kto --desirable`
    exact = "exact"
    all_gold = "all-gold"


Model = Annotated[Optional[str], typer.Option("--model", help="Base model: a folder, a .gguf file, or a hub id in the local cache (default: the embedded SmolLM2-135M-Instruct).")]
CkptOut = Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="Checkpoint directory to write (with --format llamafactory-yaml: the YAML file to write, '-' = stdout).")]
LearningRate = Annotated[Optional[float], typer.Option("--learning-rate", min=0.0, max=10.0, help="Peak learning rate (default SFT 2e-5, KTO 5e-7; thinkgr: 1e-6 / 4e-7).")]
PerDevice = Annotated[Optional[int], typer.Option("--per-device-batch-size", min=1, help="Rows per device per step (default 2).")]
Accumulation = Annotated[Optional[int], typer.Option("--gradient-accumulation", min=1, help="Steps accumulated per optimizer step (default 1).")]
EffectiveBatch = Annotated[Optional[int], typer.Option("--effective-batch-size", min=1, help="Target per-device × accumulation × processes; sets the accumulation (thinkgr: 512 SFT, 128 KTO).")]
Cutoff = Annotated[Optional[int], typer.Option("--cutoff-len", min=1, help="Longest tokenized example; longer ones are cut (default 2048).")]
Warmup = Annotated[Optional[float], typer.Option("--warmup-ratio", min=0.0, max=1.0, help="Share of the steps spent warming up (default 0.03; thinkgr SFT 0.05).")]
Epochs = Annotated[Optional[float], typer.Option("--epochs", min=0.0, max=1e6, help="Passes over the data (default 1).")]
MaxSteps = Annotated[Optional[int], typer.Option("--max-steps", min=1, help="Stop after N optimizer steps (overrides --epochs).")]
Seed = Annotated[Optional[int], typer.Option("--seed", min=0, max=2**32 - 1, help="Seed for shuffling and initialisation (default 0).")]
Packing = Annotated[Optional[bool], typer.Option("--packing/--no-packing", help="Pack several examples into one sequence (SFT).")]
Lora = Annotated[Optional[bool], typer.Option("--lora/--full", help="LoRA adapters (peft) or full fine-tuning (default full).")]
LoraRank = Annotated[Optional[int], typer.Option("--lora-rank", min=1, help="LoRA rank (default 16).")]
LoraAlpha = Annotated[Optional[int], typer.Option("--lora-alpha", min=1, help="LoRA alpha (default 32).")]
LoraTarget = Annotated[Optional[str], typer.Option("--lora-target", help="Modules to adapt: all-linear or names, comma-separated (q_proj,v_proj).")]
SaveSteps = Annotated[Optional[int], typer.Option("--save-steps", min=1, help="Write a resumable checkpoint every N steps (default 500).")]
SaveLimit = Annotated[Optional[int], typer.Option("--save-total-limit", min=1, help="Keep the last N checkpoints (default 2).")]
KeepCheckpoints = Annotated[
    Optional[bool],
    typer.Option(
        "--keep-checkpoints", help="Keep the checkpoint-* folders after a finished run (removed by default: they only serve --resume, and hold optimizer state several times the model's size)."
    ),
]
ReportTo = Annotated[
    Optional[str], typer.Option("--report-to", help="Trainer loggers, comma-separated (tensorboard, wandb, mlflow, ... as transformers names them; all: every installed one; default none).")
]
ChatTemplate = Annotated[Optional[Path], typer.Option("--chat-template", help="Jinja chat template file for a base model without one.")]
PresetOpt = Annotated[Optional[Preset], typer.Option("--preset", help="The paper's values: thinkgr (SFT full, lr 1e-6, batch 512, cutoff 2048, warmup 0.05; KTO lr 4e-7, batch 128, beta 0.1).")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", help="YAML file with the same keys as the options (learning_rate: 1e-6); options given here win.")]
DeepSpeed = Annotated[Optional[Path], typer.Option("--deepspeed", help="DeepSpeed config (examples/deepspeed/zero3.json for full fine-tuning of 8B models).")]
System = Annotated[Optional[str], typer.Option("--system", help="With a chains or responses directory: system prompt, as `export sft/kto --system`.")]
Resume = Annotated[bool, typer.Option("--resume", help="Continue from the last checkpoint in --out (after a kill).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the resolved configuration, effective batch and steps; write nothing.")]
Format = Annotated[OutFormat, typer.Option("--format", help="checkpoint: train; llamafactory-yaml: write the equivalent LLaMA-Factory config instead.")]


def _run(kind: str, data: Path, model: Optional[str], out: Path, options: dict[str, Any], *, preset, config, resume, overwrite, dry_run, fmt, as_json) -> None:

    from grtool.log import console, stage_summary
    from grtool.train.config import resolve
    from grtool.train.run import plan, train

    options = {k: v.value if isinstance(v, Enum) else v for k, v in options.items()}  # choices as their plain values
    if options.get("chat_template") is not None:
        options["chat_template"] = str(options["chat_template"])
    if options.get("deepspeed") is not None:
        options["deepspeed"] = str(options["deepspeed"])
    cfg = resolve(kind, options, config_file=config, preset=preset.value if preset else None)
    yaml_out = fmt == OutFormat.llamafactory_yaml
    p = plan(kind, data, model, out, cfg, resume=resume, overwrite=overwrite, check_out=not (dry_run or yaml_out), check_template=not yaml_out, writes_checkpoint=not yaml_out)
    report = p.report()
    if dry_run:
        if as_json:
            print_report(report)
            return
        console.print(f"[bold]train {kind}[/] {report['data']} ({report['rows']} rows, {report['data_format']}) on {report['model']} → {report['out']}", highlight=False)
        for key, value in report["config"].items():  # as a --config YAML file spells them (null, true), not as Python
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
            console.print(f"  {key}: {shown}", highlight=False, markup=False)
        console.print(
            f"effective batch {report['effective_batch_size']} = per-device {cfg.per_device_batch_size} × accumulation "
            f"{cfg.gradient_accumulation} × {report['processes']} processes; steps {report['steps']}",
            highlight=False,
        )
        return
    if yaml_out:
        from grtool.store.partloop import claim_file
        from grtool.train.llamafactory import render

        with claim_file(out, inputs=[data], stdout=True) as yaml_file:  # None: "-", standard output
            text = render(p, str(out.with_suffix("")) if yaml_file is not None else f"saves/{kind}")
            if yaml_file is None:
                typer.echo(text, nl=False)
            else:
                yaml_file.write(text.encode())
                stage_summary.print(f"LLaMA-Factory config: {out} (llamafactory-cli train {out})", highlight=False)
        return
    record = train(p)
    stage_summary.print(
        f"train {kind}: {record['global_step']} steps, loss {record['first_loss']} → {record['final_loss']}; checkpoint {out}" + (f" (adapter {record['adapter']})" if record["adapter"] else ""),
        highlight=False,
    )
    if as_json:
        import orjson

        typer.echo(orjson.dumps(record).decode())  # the checkpoint's record as written (CheckpointRecord checked it then)


def sft_cmd(
    data: Annotated[Path, typer.Argument(help="The file `export sft` wrote (LLaMA-Factory sharegpt/alpaca or TRL messages), or a filtered-chains stage directory (with --corpus).")],
    out: CkptOut,
    model: Model = None,
    corpus: Annotated[Optional[str], typer.Option("--corpus", metavar="PATH", help="With a chains directory as DATA: the corpus run holding questions/.")] = None,
    system: System = None,
    cannot_answer: CannotAnswer = None,
    learning_rate: LearningRate = None,
    per_device_batch_size: PerDevice = None,
    gradient_accumulation: Accumulation = None,
    effective_batch_size: EffectiveBatch = None,
    cutoff_len: Cutoff = None,
    warmup_ratio: Warmup = None,
    epochs: Epochs = None,
    max_steps: MaxSteps = None,
    seed: Seed = None,
    packing: Packing = None,
    lora: Lora = None,
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_target: LoraTarget = None,
    save_steps: SaveSteps = None,
    save_total_limit: SaveLimit = None,
    keep_checkpoints: KeepCheckpoints = None,
    report_to: ReportTo = None,
    chat_template: ChatTemplate = None,
    deepspeed: DeepSpeed = None,
    preset: PresetOpt = None,
    config: ConfigFile = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    dry_run: DryRun = False,
    fmt: Format = OutFormat.checkpoint,
    as_json: Json = False,
) -> None:
    """Supervised fine-tuning on the chains: loss on the assistant turn only, docid markers added as special tokens.

    The checkpoint holds the weights, the tokenizer with <docid_start>/<docid_end> (one id each; `index build --tokenizer CKPT`), and grtool.json (command, versions, data sha256, every hyperparameter, losses). With --lora the adapter goes to CKPT/adapter and CKPT holds the merged weights. Runs as is under `accelerate launch` / `torchrun`.

    Example: grtool train sft data/thinkgr_sft.json --model meta-llama/Llama-3.1-8B-Instruct --out ckpt/sft --preset thinkgr --deepspeed examples/deepspeed/zero3.json
    """
    options = {k: v for k, v in locals().items() if k not in ("data", "out", "model", "preset", "config", "resume", "overwrite", "dry_run", "fmt", "as_json")}
    _run("sft", data, model, out, options, preset=preset, config=config, resume=resume, overwrite=overwrite, dry_run=dry_run, fmt=fmt, as_json=as_json)


def _train_extras(words: str) -> Callable[[Mapping[str, Any]], list[tuple[str, str]]]:
    """Training needs TRL and torch; a --dry-run, or writing a LLaMA-Factory config, does not."""

    def extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
        checkpoint = options.get("format", OutFormat.checkpoint) in (OutFormat.checkpoint, "checkpoint")
        return [("train", words)] if checkpoint and not options.get("dry_run") else []

    return extras


register(
    Command(
        "train sft",
        sft_cmd,
        reads={"data": PathKind.STAGE, "corpus": TableInput("questions"), "chat_template": PathKind.FILE, "deepspeed": PathKind.FILE, "config": PathKind.FILE},
        writes={"out": PathKind.DIRECTORY},
        extras=_train_extras("train sft"),
        report="grtool.train.run:TrainPlanReport",
    )
)


def kto_cmd(
    data: Annotated[
        Path,
        typer.Argument(
            help="The file `export kto` wrote (LLaMA-Factory sharegpt with kto_tag, or TRL prompt/completion/label), or responses (a `retrieve` directory or its JSON Lines) with --corpus and --triples."
        ),
    ],
    out: CkptOut,
    model: Annotated[Optional[str], typer.Option("--model", help="The SFT checkpoint (also the reference model).")] = None,
    corpus: Annotated[Optional[str], typer.Option("--corpus", metavar="PATH", help="With responses as DATA: the corpus run holding questions/ (gold documents).")] = None,
    triples: Annotated[Optional[str], typer.Option("--triples", metavar="PATH", help="With responses as DATA: the triples the docids resolve against, as `export kto`.")] = None,
    tau: Annotated[Optional[float], typer.Option("--tau", min=0.0, max=1.0, help="With responses: recall below it is undesirable (default 0.5, as `export kto`).")] = None,
    desirable: Annotated[Optional[Desirable], typer.Option("--desirable", help="With responses: exact (default; the gold set exactly) or all-gold (every gold document, extras allowed).")] = None,
    system: System = None,
    cannot_answer: CannotAnswer = None,
    beta: Annotated[Optional[float], typer.Option("--beta", min=0.0, help="KTO beta (default 0.1, as the paper).")] = None,
    desirable_weight: Annotated[Optional[float], typer.Option("--desirable-weight", min=0.0, help="Default: the balancing weight of the data's class counts.")] = None,
    undesirable_weight: Annotated[Optional[float], typer.Option("--undesirable-weight", min=0.0, help="Default: the balancing weight of the data's class counts.")] = None,
    learning_rate: LearningRate = None,
    per_device_batch_size: PerDevice = None,
    gradient_accumulation: Accumulation = None,
    effective_batch_size: EffectiveBatch = None,
    cutoff_len: Cutoff = None,
    warmup_ratio: Warmup = None,
    epochs: Epochs = None,
    max_steps: MaxSteps = None,
    seed: Seed = None,
    lora: Lora = None,
    lora_rank: LoraRank = None,
    lora_alpha: LoraAlpha = None,
    lora_target: LoraTarget = None,
    save_steps: SaveSteps = None,
    save_total_limit: SaveLimit = None,
    keep_checkpoints: KeepCheckpoints = None,
    report_to: ReportTo = None,
    chat_template: ChatTemplate = None,
    deepspeed: DeepSpeed = None,
    preset: PresetOpt = None,
    config: ConfigFile = None,
    resume: Resume = False,
    overwrite: Overwrite = False,
    dry_run: DryRun = False,
    fmt: Format = OutFormat.checkpoint,
    as_json: Json = False,
) -> None:
    """KTO on responses labelled by retrieval (desirable / undesirable), from the SFT checkpoint, which is also the reference model.

    Desirable/undesirable weights default to the ones that balance the data's class counts (as `export kto` prints). A file with one class only is refused.

    Responses are labelled on the fly with `export kto`'s rule (--corpus, --triples, --tau, --desirable); the counts and the rule go into grtool.json.

    Example: grtool train kto data/thinkgr_kto.json --model ckpt/sft --out ckpt/kto --preset thinkgr
    """
    options = {k: v for k, v in locals().items() if k not in ("data", "out", "model", "preset", "config", "resume", "overwrite", "dry_run", "fmt", "as_json")}
    _run("kto", data, model, out, options, preset=preset, config=config, resume=resume, overwrite=overwrite, dry_run=dry_run, fmt=fmt, as_json=as_json)


register(
    Command(
        "train kto",
        kto_cmd,
        reads={"data": PathKind.STAGE, "corpus": TableInput("questions"), "triples": TableInput("triples"), "chat_template": PathKind.FILE, "deepspeed": PathKind.FILE, "config": PathKind.FILE},
        writes={"out": PathKind.DIRECTORY},
        extras=_train_extras("train kto"),
        report="grtool.train.run:TrainPlanReport",
    )
)
