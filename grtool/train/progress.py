"""Training progress through grtool's consoles: a Rich bar with loss and ETA on a terminal, plain lines in a log;
and the stop a SIGTERM asks for, at the end of a step (grtool/signals.py)."""

from __future__ import annotations

from transformers import TrainerCallback


class TrainProgress(TrainerCallback):
    """Steps done of the planned total, the last logged loss; collects every logged loss in ``losses``."""

    def __init__(self, description: str, losses: list[tuple[int, float]]):
        self.description = description
        self.losses = losses
        self.bar = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.progress import TextColumn

        from grtool.log import progress

        self.bar = progress(TextColumn("loss {task.fields[loss]}"))
        self.bar.start()
        self.task = self.bar.add_task(self.description, total=state.max_steps or None, completed=state.global_step, loss="-")

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append((state.global_step, float(logs["loss"])))
            if self.bar is not None:
                self.bar.update(self.task, loss=f"{float(logs['loss']):.4f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(self.task, completed=state.global_step)
        self.close()

    def close(self, failed: bool = False) -> None:
        """The bar's last line ("stopped" where ``failed``); its thread ends. Also where training raised (a stop, a
        divergence) and the Trainer never called on_train_end: the thread would otherwise outlive the command,
        printing "still running" lines through a pipeline's later stages run in the same process."""
        if self.bar is not None:
            self.bar._failed = failed  # what LogProgress.__exit__ records for a bar used as a context
            self.bar.stop()
            self.bar = None


class StopWhenAsked(TrainerCallback):
    """After the step in progress when a SIGTERM came (:func:`grtool.signals.deferred`): save a checkpoint and end
    training; the caller then stops with the transient code."""

    def on_step_end(self, args, state, control, **kwargs):
        from grtool import signals

        if signals.requested() is not None:
            control.should_save = True
            control.should_training_stop = True
        return control


class NonFiniteTraining(Exception):
    """Raised inside the Trainer when the loss, the gradient norm or the weights are no longer finite."""


class StopOnNonFinite(TrainerCallback):
    """A logged loss or gradient norm that is NaN or infinite stops the run before anything of it is saved (the
    Trainer logs a step before it saves it): a model with non-finite weights writes nothing but end-of-text, and
    KTO even reports its loss as 0.0. The weights themselves are checked before every save (:func:`check_finite`),
    which covers the steps between two logs."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        import math

        for key in ("loss", "grad_norm"):
            value = (logs or {}).get(key)
            if isinstance(value, (int, float)) and not math.isfinite(value):
                raise NonFiniteTraining(f"{key} is {value} at step {state.global_step}")


def check_finite(model) -> None:
    """Every weight of ``model`` is finite (on this process; a sharded parameter checks its own shard)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.numel() and not bool(torch.isfinite(param).all()):
                raise NonFiniteTraining(f"weight {name} holds NaN or infinite values")
