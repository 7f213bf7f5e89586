"""Which parts one task of a sharded run owns: ``--num-shards/--shard-index``, defaulting to a Slurm array's."""

from __future__ import annotations

from collections.abc import Mapping

from grtool.errors import GrtoolError, InputError
from grtool.userinput import MAX_ARRAY_TASKS, env

__all__ = ["MAX_ARRAY_TASKS", "parts_for_task", "resolve_sharding", "slurm_array_task"]


def slurm_array_task(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(task count, this task's index from 0)`` from a Slurm array task's variables, None outside an array. The
    index is the task's place in the array: ``(SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP``
    (``--array=0-8:2`` numbers its tasks 0, 2, ..., 8). A variable that is not a bounded integer (parsed by the
    registry of :mod:`grtool.userinput`), or an id that is not one of the array's, is a usage error (exit 2)."""
    count, task_id = env("SLURM_ARRAY_TASK_COUNT", environ), env("SLURM_ARRAY_TASK_ID", environ)
    if count is None and task_id is None:
        return None
    if count is None:
        raise InputError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not: give --num-shards/--shard-index")
    if task_id is None:
        return count, 0
    first, step = env("SLURM_ARRAY_TASK_MIN", environ), env("SLURM_ARRAY_TASK_STEP", environ)
    if task_id < first or (task_id - first) % step:
        raise InputError(f"SLURM_ARRAY_TASK_ID={task_id} is not an id of the array that starts at SLURM_ARRAY_TASK_MIN={first} "
                         f"with step SLURM_ARRAY_TASK_STEP={step}: give --num-shards/--shard-index")  # fmt: skip
    index = (task_id - first) // step
    if index >= count:
        raise InputError(f"SLURM_ARRAY_TASK_ID={task_id} is task {index} of the array (SLURM_ARRAY_TASK_MIN={first}, "
                         f"SLURM_ARRAY_TASK_STEP={step}), past SLURM_ARRAY_TASK_COUNT={count}: give --num-shards/--shard-index")  # fmt: skip
    return count, index


def resolve_sharding(num_shards: int | None, shard_index: int | None, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``--num-shards/--shard-index``, defaulting to the Slurm array variables, else one task."""
    if num_shards is None or shard_index is None:
        array = slurm_array_task(environ)
        count, index = array or (1, 0)
        num_shards = count if num_shards is None else num_shards
        shard_index = index if shard_index is None else shard_index
    if num_shards < 1:
        raise GrtoolError(f"--num-shards must be at least 1, got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise GrtoolError(f"--shard-index must be in [0, {num_shards}), got {shard_index}")
    return num_shards, shard_index


def parts_for_task(num_parts: int, num_shards: int, shard_index: int) -> list[int]:
    """The output parts one task owns: round-robin, so every task gets a similar share."""
    return [p for p in range(num_parts) if p % num_shards == shard_index]
