"""The resolved training configuration: defaults < ``--preset`` < ``--config FILE`` < explicit options.

Every key is the option's name with dashes as underscores (``--learning-rate`` → ``learning_rate``), the same
in the YAML file of ``--config``. The effective batch size is per-device × accumulation × processes;
``effective_batch_size`` (what the paper and the presets give) derives the accumulation from the other two,
unless a later layer sets ``gradient_accumulation`` itself.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any, get_args, get_type_hints

import msgspec

from grtool.errors import InputError
from grtool.records import field_message
from grtool.userinput import read_input_bytes

# The paper's values (ThinkGR): SFT full fine-tuning, lr 1e-6, batch 512, cutoff 2048, warmup 0.05;
# KTO lr 4e-7, batch 128, beta 0.1.
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "thinkgr": {
        "sft": {"lora": False, "learning_rate": 1e-6, "effective_batch_size": 512, "cutoff_len": 2048, "warmup_ratio": 0.05},
        "kto": {"lora": False, "learning_rate": 4e-7, "effective_batch_size": 128, "beta": 0.1},
    }
}

# What --report-to may name: transformers' reporting integrations (INTEGRATION_TO_CALLBACK in
# transformers/integrations/integration_utils.py, 5.x; kept here so the check needs no transformers import), each
# with the modules one of which it needs (None: nothing to import) and the PyPI package that brings it. Also
# accepted: none, and all (every integration installed). An unknown name or a missing package would otherwise
# stop the run only when the trainer is built, after --out was written.
REPORT_TO: dict[str, tuple[tuple[str, ...], str | None]] = {
    "azure_ml": (("azureml",), "azureml-core"),
    "clearml": (("clearml",), "clearml"),
    "codecarbon": (("codecarbon",), "codecarbon"),
    "comet_ml": (("comet_ml",), "comet-ml"),
    "dagshub": (("dagshub",), "dagshub"),  # (and mlflow)
    "dvclive": (("dvclive",), "dvclive"),
    "flyte": (("flytekit",), "flytekit"),
    "kubeflow": ((), None),  # a Kubeflow trainer server, found from the environment
    "mlflow": (("mlflow",), "mlflow"),
    "neptune": (("neptune",), "neptune"),
    "swanlab": (("swanlab",), "swanlab"),
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "trackio": (("trackio",), "trackio"),
    "wandb": (("wandb",), "wandb"),
}

# lr_scheduler (a --config key): transformers' SchedulerType values that need no scheduler arguments (grtool passes
# none; cosine_with_min_lr, warmup_stable_decay, reduce_lr_on_plateau ... would fail when the trainer starts).
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt")


@dataclass
class TrainConfig:
    kind: str = "sft"  # sft | kto
    learning_rate: float | None = None  # None: 2e-5 for SFT, 5e-7 for KTO
    per_device_batch_size: int = 2
    gradient_accumulation: int = 1
    effective_batch_size: int | None = None
    cutoff_len: int = 2048
    warmup_ratio: float = 0.03
    epochs: float = 1.0
    max_steps: int | None = None  # set (≥ 1): overrides epochs
    seed: int = 0
    packing: bool = False
    lora: bool = False
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_target: str = "all-linear"
    lr_scheduler: str = "cosine"
    save_steps: int = 500
    save_total_limit: int = 2
    keep_checkpoints: bool = False  # checkpoint-* folders only serve --resume: removed once the run has finished
    logging_steps: int = 1
    report_to: str = "none"
    deepspeed: str | None = None
    bf16: bool | None = None  # None: when a GPU supports it
    chat_template: str | None = None
    # KTO
    beta: float = 0.1
    desirable_weight: float | None = None  # None: the balancing weights of the data's class counts
    undesirable_weight: float | None = None
    # a filtered-chains stage directory as DATA: how to build the rows (as `export sft`)
    corpus: str | None = None
    # responses as KTO DATA (with corpus): labelled on the fly by retrieval, as `export kto` labels them
    triples: str | None = None
    tau: float = 0.5
    desirable: str = "exact"
    system: str | None = None
    markers: str = "special"
    cannot_answer: str | None = None  # the sentence the instruction names, as `export sft|kto --cannot-answer`

    @property
    def lr(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 2e-5 if self.kind == "sft" else 5e-7

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["learning_rate"] = self.lr
        return out


KEYS = {f.name for f in fields(TrainConfig)} - {"kind"}


def world_size() -> int:
    """Processes of this run: ``WORLD_SIZE`` as set by torchrun / accelerate launch, else 1."""
    from grtool.userinput import env

    return env("WORLD_SIZE")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The keys of a ``--config`` YAML file, decoded through :data:`ConfigFile` (the options' own types)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(read_input_bytes(path)) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        why = " ".join(str(getattr(e, "problem", None) or e).split())  # one line (PyYAML draws the spot below)
        raise InputError(f"--config {path}: not valid YAML ({where}{why})") from None
    except RecursionError:
        raise InputError(f"--config {path}: not valid YAML (nested too deep)") from None
    except UnicodeDecodeError:
        raise InputError(f"--config {path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise InputError(f"--config {path}: expected a mapping of option names to values")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - KEYS - {"preset"})
    if unknown:
        raise InputError(f"--config {path}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(KEYS | {'preset'}))})")
    try:
        decoded = msgspec.convert(data, type=ConfigFile)
    except msgspec.ValidationError as e:
        raise InputError(f"--config {path}: {field_message(e)}") from None
    except RecursionError:
        raise InputError(f"--config {path}: a value nested too deep") from None
    values = {k: getattr(decoded, k) for k in data}
    for k in _FLOATS & set(values):
        if isinstance(values[k], str):  # YAML reads 1e-6 (no dot) as text: a number written so is the number
            values[k] = float(values[k])
    return values  # ranges (NaN and infinity included) are checked with the options' own: check()


# What --config may hold: each option's own type (TrainConfig's annotations, read by typing, not by their text);
# a float may also be written as number text. Undeclared keys are refused above with the list of known ones.
_NUMBER_TEXT = Annotated[str, msgspec.Meta(pattern=r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")]
_HINTS = {k: v for k, v in get_type_hints(TrainConfig).items() if k in KEYS}
_FLOATS = {k for k, t in _HINTS.items() if t is float or float in get_args(t)}


def _file_type(t: Any) -> Any:
    if t is float:
        return float | _NUMBER_TEXT
    if float in get_args(t):  # float | None
        return float | _NUMBER_TEXT | None
    return t


ConfigFile = msgspec.defstruct(
    "ConfigFile",
    [(k, _file_type(t), msgspec.UNSET) for k, t in _HINTS.items()] + [("preset", str, msgspec.UNSET)],
    forbid_unknown_fields=True,
    kw_only=True,
)


def _apply(values: dict[str, Any], layer: dict[str, Any]) -> None:
    layer = {k: v for k, v in layer.items() if v is not None}
    if "gradient_accumulation" in layer and "effective_batch_size" not in layer:
        values.pop("effective_batch_size", None)  # an explicit accumulation replaces a lower layer's batch target
    values.update(layer)


def resolve(kind: str, options: dict[str, Any], config_file: str | Path | None = None, preset: str | None = None) -> TrainConfig:
    """The configuration from the layers; ``options`` holds only the options given on the command line."""
    file_values = read_config_file(config_file) if config_file else {}
    preset = options.get("preset") or preset or file_values.pop("preset", None)
    file_values.pop("preset", None)
    values: dict[str, Any] = {}
    if preset:
        if preset not in PRESETS:
            raise InputError(f"--preset {preset!r}: unknown (known: {', '.join(PRESETS)})")
        _apply(values, PRESETS[preset][kind])
    _apply(values, file_values)
    _apply(values, {k: v for k, v in options.items() if k in KEYS and v is not None})
    cfg = TrainConfig(kind=kind, **{k: v for k, v in values.items() if k in KEYS})
    if cfg.effective_batch_size is not None and not 1 <= cfg.effective_batch_size <= MAX_INT:
        raise InputError(f"--effective-batch-size {cfg.effective_batch_size}: accepted is a whole number from 1 to {MAX_INT}")
    if cfg.effective_batch_size is not None:
        per_step = cfg.per_device_batch_size * world_size()
        cfg.gradient_accumulation = max(1, math.ceil(cfg.effective_batch_size / per_step))
        if cfg.gradient_accumulation * per_step != cfg.effective_batch_size:
            from grtool.log import log

            log.warning(
                "effective batch %d is not a multiple of per-device %d × %d processes: using accumulation %d (batch %d)",
                cfg.effective_batch_size, cfg.per_device_batch_size, world_size(), cfg.gradient_accumulation,
                cfg.gradient_accumulation * per_step,
            )  # fmt: skip
    check(cfg)
    return cfg


# Whole-number settings are at most this: every one of them ends up in a C integer of torch or the tokenizers,
# and a larger one (a typo) would fail mid-run instead of here.
MAX_INT = 2**31 - 1
MAX_SEED = 2**32 - 1  # numpy's seed (the Trainer seeds numpy, random and torch with it)


def _finite(name: str, value: float, *, low: float, high: float = math.inf, low_open: bool = True, high_open: bool = True, accepted: str) -> None:
    """A number option is finite and within its range; the message names what is accepted."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (math.isfinite(value) and above and below):
        raise InputError(f"--{name.replace('_', '-')} {value}: accepted is {accepted}")


def check(cfg: TrainConfig) -> None:
    """Every setting within its range, before anything is read or loaded (NaN and infinity included: a run with
    them trains, saves non-finite weights and reports a loss of 0)."""
    for name in ("per_device_batch_size", "gradient_accumulation", "cutoff_len", "lora_rank", "lora_alpha", "save_steps",
                 "save_total_limit", "logging_steps"):  # fmt: skip
        if not 1 <= getattr(cfg, name) <= MAX_INT:
            raise InputError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: accepted is a whole number from 1 to {MAX_INT}")
    if cfg.max_steps is not None and not 1 <= cfg.max_steps <= MAX_INT:
        raise InputError(f"--max-steps {cfg.max_steps}: accepted is a whole number from 1 to {MAX_INT} (leave it out to train --epochs)")
    if not 0 <= cfg.seed <= MAX_SEED:
        raise InputError(f"--seed {cfg.seed}: accepted is a whole number from 0 to {MAX_SEED} (2**32 - 1)")
    _finite("warmup_ratio", cfg.warmup_ratio, low=0.0, low_open=False, high=1.0, accepted="a number in [0, 1)")
    _finite("learning_rate", cfg.lr, low=0.0, high=1.0, high_open=False, accepted="a finite number > 0 and ≤ 1 (e.g. 2e-5)")
    _finite("epochs", cfg.epochs, low=0.0, high=1e6, high_open=False, accepted="a finite number of passes > 0 (at most 1e6)")
    _finite("tau", cfg.tau, low=0.0, high=1.0, high_open=False, accepted="a number in (0, 1]")
    if cfg.desirable not in ("exact", "all-gold"):
        raise InputError(f"--desirable must be exact or all-gold, got {cfg.desirable!r}")
    if cfg.markers not in ("special", "brackets"):
        raise InputError(f"--markers must be special or brackets, got {cfg.markers!r}")
    if cfg.cannot_answer is not None and (not cfg.cannot_answer.strip() or "\n" in cfg.cannot_answer.strip()):
        raise InputError("--cannot-answer: give one non-empty sentence on one line")
    _finite("beta", cfg.beta, low=0.0, high=1e6, high_open=False, accepted="a finite number > 0 (default 0.1)")
    for name in ("desirable_weight", "undesirable_weight"):
        if getattr(cfg, name) is not None:
            _finite(name, getattr(cfg, name), low=0.0, high=1e6, high_open=False, accepted="a finite number > 0")
    if cfg.lr_scheduler not in LR_SCHEDULERS:
        raise InputError(f"lr_scheduler {cfg.lr_scheduler!r} (--config): not one of {', '.join(LR_SCHEDULERS)}")
    if cfg.lora and not any(t.strip() for t in cfg.lora_target.split(",")):
        raise InputError(f"--lora-target {cfg.lora_target!r}: names no module (all-linear, or names such as q_proj,v_proj)")
    check_report_to(cfg.report_to)
    if cfg.deepspeed:
        check_deepspeed_config(cfg.deepspeed)
    if cfg.chat_template and not Path(cfg.chat_template).is_file():
        raise InputError(f"--chat-template {cfg.chat_template}: no such file")


def check_deepspeed_config(path: str) -> None:
    """--deepspeed names a JSON object (the trainer would fail on it only after --out was written)."""
    import orjson

    if not Path(path).is_file():
        raise InputError(f"--deepspeed {path}: no such file")
    try:
        config = orjson.loads(Path(path).read_bytes())  # bounded nesting: a deep file is a JSONDecodeError
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--deepspeed {path}: not a JSON DeepSpeed config ({e})") from None
    if not isinstance(config, dict):
        raise InputError(f"--deepspeed {path}: expected a JSON object (a DeepSpeed config such as examples/deepspeed/zero3.json)")


def check_lora(cfg: TrainConfig, layers: list[str], hidden_size: int | None) -> None:
    """Each --lora-target name matches a layer LoRA can adapt, as peft matches them (the whole name or its last
    parts), and --lora-rank is at most the hidden size (a larger rank adds no capacity and exhausts memory); peft
    would fail only after the model loaded, with a traceback. Unknown layers (no names): nothing to check."""
    if not cfg.lora:
        return
    if hidden_size is not None and cfg.lora_rank > hidden_size:
        raise InputError(f"--lora-rank {cfg.lora_rank}: more than the model's hidden size of {hidden_size}; accepted is 1 to {hidden_size}")
    if cfg.lora_target == "all-linear" or not layers:
        return
    wanted = [t.strip() for t in cfg.lora_target.split(",") if t.strip()]
    unknown = [t for t in wanted if not any(n == t or n.endswith("." + t) for n in layers)]
    if unknown:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in layers if n and not n.rsplit(".", 1)[-1].isdigit()})
        raise InputError(
            f"--lora-target {cfg.lora_target}: the model has no layer LoRA can adapt named {', '.join(unknown)} (its linear, embedding and convolution layers: {', '.join(leaves[:30])}; or all-linear)"
        )


def check_cutoff(cfg: TrainConfig, context: int | None) -> None:
    """--cutoff-len within the model's context (unknown context: nothing to check); past it the positions
    have no embedding and the run crashes after training, when the weights are saved or first used."""
    if context is not None and cfg.cutoff_len > context:
        raise InputError(f"--cutoff-len {cfg.cutoff_len}: longer than the model's context of {context} tokens; accepted is 1 to {context}")


def report_to_names(value: str) -> list[str]:
    """The loggers a --report-to value names (``none`` and empty items dropped)."""
    return [r.strip() for r in value.split(",") if r.strip() and r.strip() != "none"]


def check_report_to(value: str) -> None:
    """--report-to names known loggers only; ``all`` stands alone."""
    names = report_to_names(value)
    unknown = [n for n in names if n not in REPORT_TO and n != "all"]
    if unknown:
        raise InputError(f"--report-to {value}: unknown logger {', '.join(unknown)} (known: none, all, {', '.join(REPORT_TO)})")
    if "all" in names and len(names) > 1:
        raise InputError(f"--report-to {value}: 'all' already names every installed logger; give it alone")


def check_report_to_installed(value: str) -> None:
    """Each logger --report-to names for a run on this machine has its package installed."""
    import importlib.util

    from grtool.errors import MissingDependency
    from grtool.userinput import env

    for name in report_to_names(value):
        modules, package = REPORT_TO.get(name, ((), None))
        if modules and not any(importlib.util.find_spec(m) is not None for m in modules):
            raise MissingDependency(f"--report-to {name}", package or modules[0], package)
        if name == "kubeflow" and (env("KUBEFLOW_TRAINER_SERVER_URL") is None or str(env("DISABLE_KUBEFLOW_INTEGRATION")).upper() == "TRUE"):
            # transformers' callback raises when the trainer starts, after --out exists
            raise InputError(
                "--report-to kubeflow: reports to the Kubeflow trainer server named by KUBEFLOW_TRAINER_SERVER_URL, which is not set "
                "here (a Kubeflow TrainJob sets it) or DISABLE_KUBEFLOW_INTEGRATION turns it off; leave kubeflow out"
            )


def effective_batch(cfg: TrainConfig) -> int:
    return cfg.per_device_batch_size * cfg.gradient_accumulation * world_size()


def planned_steps(cfg: TrainConfig, rows: int) -> int:
    """Optimizer steps the Trainer will run over ``rows`` examples (before packing)."""
    if cfg.max_steps is not None:
        return cfg.max_steps
    batches = math.ceil(rows / (cfg.per_device_batch_size * world_size()))
    per_epoch = max(batches // cfg.gradient_accumulation, 1)
    return math.ceil(cfg.epochs * per_epoch)
