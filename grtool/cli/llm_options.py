"""The LLM options every generating command shares, spelled the same way everywhere.

Decorate a Typer command with ``@llm_options(...)`` and give it a keyword parameter ``llm: LLMSettings``; the
decorator adds ``--backend``, ``--model``, ``--temperature`` … to the command's signature and hands their values
over as one :class:`LLMSettings`::

    @app.command()
    @llm_options(temperature=0.7, max_tokens=512)
    def synthesize(questions: Path, out: Out, llm: LLMSettings = None) -> None:
        backend = llm.make_backend()
        sampling = llm.sampling()
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

from grtool.cli.options import AddedParameters
from grtool.extras import require_backend
from grtool.llm import BACKENDS, DEFAULT_BACKEND, check_backend_options, make_backend
from grtool.userinput import cache_root

if TYPE_CHECKING:
    from grtool.llm.base import Backend, Sampling

_PANEL = "LLM"

# --backend as a choice: --help and shell completion list the names, a wrong one is a usage error before anything runs
BackendName = Enum("BackendName", {name: name for name in BACKENDS}, type=str)


@dataclass
class LLMSettings:
    backend: str = DEFAULT_BACKEND
    model: Optional[str] = None
    temperature: Optional[float] = 0.0  # None: the command decides (retrieve)
    top_p: float = 1.0
    max_tokens: int = 1024
    seed: int = 0
    base_url: Optional[str] = None
    api_key_env: Optional[str] = None
    concurrency: Optional[int] = None
    timeout: Optional[float] = None
    max_retries: Optional[int] = None
    max_context: Optional[int] = None
    tensor_parallel_size: Optional[int] = None
    gpu_memory_utilization: Optional[float] = None
    max_model_len: Optional[int] = None
    enforce_eager: Optional[bool] = None
    batch_size: Optional[int] = None
    threads: Optional[int] = None
    cache_dir: Optional[Path] = None
    no_cache: bool = False

    def backend_options(self) -> dict[str, Any]:
        """The options meant for the backend (unset ones are None and ignored by make_backend)."""
        names = ("base_url", "api_key_env", "concurrency", "timeout", "max_retries", "max_context", "tensor_parallel_size",
                 "gpu_memory_utilization", "max_model_len", "enforce_eager", "batch_size", "threads")  # fmt: skip
        return {n: getattr(self, n) for n in names}

    def check(self) -> None:
        """Everything about these options that can be checked before the command creates anything: the options
        themselves (:meth:`check_options`), a --model no local backend could load, and the room --max-tokens
        leaves."""
        from grtool.llm.models import check_model

        self.check_options()
        check_model(self.backend, self.model)
        self.check_room()

    def check_options(self) -> None:
        """The checks that need neither the backend's packages nor the model: options the backend does not take
        or values it can never use (--base-url). (In a pipeline, --model may be what an earlier stage trains.)"""
        check_backend_options(self.backend, self.backend_options())

    def check_room(self) -> None:
        """Refuse a --max-tokens that leaves no room for any prompt before the command creates anything, when the
        model's context is known without loading it (the backend checks again once loaded)."""
        from grtool.llm.base import check_room
        from grtool.llm.models import known_context

        check_room(self.max_tokens, known_context(self.backend, self.model, self.backend_options()))

    def make_backend(self) -> Backend:
        return make_backend(self.backend, self.model, **self.backend_options())

    def sampling(self, **overrides: Any) -> Sampling:
        from grtool.llm.base import Sampling

        return Sampling(temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens, seed=self.seed, **overrides)

    def cache_dir_for(self, out: Path | str) -> Path | None:
        """Where the request cache lives: ``--cache-dir``, else beside the output (``OUT/_llm_cache``); None = off."""
        if self.no_cache:
            return None
        if self.cache_dir is not None:
            refuse_cache_over_output(Path(self.cache_dir), out)
            return Path(self.cache_dir)
        if str(out) == "-":
            return cache_root() / "requests"
        return Path(out) / "_llm_cache"

    def identity(self, model_name: str) -> dict[str, Any]:
        """What belongs in a stage's parameters: the backend, the model and the sampling; never transport or secrets."""
        return {"backend": self.backend, "model": model_name, "sampling": self.sampling().as_dict()}


def refuse_cache_over_output(cache: Path, out: Path | str) -> None:
    """--cache-dir is written too: it may lie inside --out (as the default OUT/_llm_cache does), never be it nor
    hold it (the cache's files would mix with the stage's, and --overwrite of one would meet the other)."""
    from grtool.errors import InputError
    from grtool.store.paths import is_within, real
    from grtool.errors import printable

    if str(out) != "-" and is_within(real(out), real(cache)):
        what = "is" if real(out) == real(cache) else "contains"
        raise InputError(f"--cache-dir {printable(cache)}: {what} --out {printable(out)}, which this command also writes; put the request cache somewhere else")


def _options(defaults: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default) of every shared option."""
    O = functools.partial(typer.Option, rich_help_panel=_PANEL)  # noqa: E741
    return [
        ("backend", Annotated[BackendName, O("--backend", help="LLM backend.")], BackendName(DEFAULT_BACKEND)),
        (
            "model",
            Annotated[
                Optional[str],
                O(
                    "--model",
                    "-m",
                    help="Model: HF id or local folder (vllm, transformers), a .gguf file (converted once), or the served name (openai). Default: the embedded SmolLM2-135M-Instruct; with openai, the server's only model.",
                ),
            ],
            None,
        ),
        ("temperature", _temperature_option(O, defaults), defaults.get("temperature", 0.0)),
        ("top_p", Annotated[float, O("--top-p", min=0.0, max=1.0, help="Nucleus sampling mass.")], defaults.get("top_p", 1.0)),
        ("max_tokens", Annotated[int, O("--max-tokens", min=1, help="Most tokens generated per request.")], defaults.get("max_tokens", 1024)),
        ("seed", Annotated[int, O("--seed", min=0, max=2**32 - 1, help="Sampling seed (sent with every request).")], defaults.get("seed", 0)),
        ("base_url", Annotated[Optional[str], O("--base-url", help="openai: server URL up to /v1 (default http://127.0.0.1:8000/v1).")], None),
        (
            "api_key_env",
            Annotated[Optional[str], O("--api-key-env", help="openai: environment variable holding the API key (default OPENAI_API_KEY). The key itself is never taken on the command line.")],
            None,
        ),
        ("concurrency", Annotated[Optional[int], O("--concurrency", min=1, help="openai: requests in flight (default 16).")], None),
        (
            "timeout",
            Annotated[
                Optional[float],
                O("--timeout", min=0.1, max=86_400.0, help="openai: seconds one request attempt may take in all, answer read to its end, before it counts as failed and is retried (default 600)."),
            ],
            None,
        ),
        ("max_retries", Annotated[Optional[int], O("--max-retries", min=0, help="openai: retries per request on connection errors, timeouts, 429 and 5xx (default 8).")], None),
        (
            "max_context",
            Annotated[
                Optional[int],
                O(
                    "--max-context",
                    min=16,
                    help="openai: the served model's context in tokens (default: the max_model_len the server reports in /models, if any); prompts certain to exceed it with --max-tokens are rejected as too_long without being sent.",
                ),
            ],
            None,
        ),
        ("tensor_parallel_size", Annotated[Optional[int], O("--tensor-parallel-size", min=1, help="vllm: GPUs per model (default 1).")], None),
        ("gpu_memory_utilization", Annotated[Optional[float], O("--gpu-memory-utilization", min=0.05, max=1.0, help="vllm: share of GPU memory for the engine (default 0.9).")], None),
        ("max_model_len", Annotated[Optional[int], O("--max-model-len", min=16, help="vllm: context length (default: the model's).")], None),
        ("enforce_eager", Annotated[Optional[bool], O("--enforce-eager/--no-enforce-eager", help="vllm: no CUDA graphs / compilation (needed by the CPU build).")], None),
        ("batch_size", Annotated[Optional[int], O("--batch-size", min=1, help="transformers: prompts per forward batch (default 8).")], None),
        (
            "threads",
            Annotated[Optional[int], O("--threads", min=1, help="transformers: CPU threads (default: one per CPU this process may use, or OMP_NUM_THREADS). On a loaded machine fewer can be faster.")],
            None,
        ),
        ("cache_dir", Annotated[Optional[Path], O("--cache-dir", help="Request cache directory (default: OUT/_llm_cache).")], None),
        ("no_cache", Annotated[bool, O("--no-cache", help="Do not read or write the request cache.")], False),
    ]


def _temperature_option(O: Callable, defaults: dict[str, Any]) -> Any:
    """--temperature; a command whose default is None (``retrieve``: greedy for one sample, sampled for several)
    takes it as optional and decides itself."""
    if "temperature" in defaults and defaults["temperature"] is None:
        return Annotated[Optional[float], O("--temperature", min=0.0, max=100.0, help="Sampling temperature (0 = greedy; default: the command's).")]
    return Annotated[float, O("--temperature", min=0.0, max=100.0, help="Sampling temperature (0 = greedy).")]


def backend_extras(options: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The extra of the --backend a generating command's parsed options name (none for a remote server)."""
    from grtool.extras import BACKEND_EXTRAS

    backend = options.get("backend", DEFAULT_BACKEND)
    backend = str(backend.value if isinstance(backend, Enum) else backend)
    return [(BACKEND_EXTRAS[backend], f"--backend {backend}")] if backend in BACKEND_EXTRAS else []


def llm_options(needed: Callable[[dict[str, Any]], bool] | None = None, **defaults: Any) -> Callable:
    """Add the shared LLM options to a Typer command; it receives them as ``llm: LLMSettings``.

    ``defaults`` change a default for this command (``temperature=0.7``, ``max_tokens=512``). ``needed(kwargs)``:
    whether this invocation uses a model at all (`retrieve --method bm25` does not); when not, the backend's extra
    and the model are not checked.
    """
    names = [f.name for f in fields(LLMSettings)]  # the options' parameters (:func:`_options` makes one per field)
    unknown = set(defaults) - set(names)
    if unknown:
        raise TypeError(f"unknown LLM option defaults: {sorted(unknown)}")

    def settings_of(values: dict[str, Any]) -> LLMSettings:
        values = {n: values[n] for n in names if n in values}
        if isinstance(values.get("backend"), Enum):
            values["backend"] = values["backend"].value  # the plain name, as manifests and backends know it
        return LLMSettings(**values)

    def call(command: Callable, *args: Any, **kwargs: Any) -> Any:
        settings = settings_of(kwargs)
        if needed is None or needed(kwargs):
            require_backend(settings.backend)  # a missing extra stops the command before it creates anything
            settings.check()
        kwargs = {k: v for k, v in kwargs.items() if k not in names}
        return command(*args, llm=settings, **kwargs)

    def added() -> list[inspect.Parameter]:
        return [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a) for n, a, d in _options(defaults)]

    def decorate(command: Callable) -> Callable:
        from grtool.pipeline.registry import parameter_names

        if "llm" not in parameter_names(command):
            raise TypeError(f"{command.__name__} needs a parameter 'llm: LLMSettings'")
        wrapper = AddedParameters(command, added, names, call, dropped=("llm",))
        # From the parsed parameters alone: a pipeline checks every stage's options so before the first stage runs
        # (also for a plan, which needs no extras; the extras, the model and its room are checked when it runs).
        wrapper.check_options = lambda values: settings_of(values).check_options()  # type: ignore[attr-defined]
        return wrapper

    return decorate


def settings_dict(settings: LLMSettings) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
