"""Which parts one task of a sharded run owns: ``--num-shards/--shard-index``, defaulting to a Slurm array's."""

from __future__ import annotations

from grtool.errors import InputError
from grtool.userinput import env


def resolve_sharding(num_shards: int | None, shard_index: int | None) -> tuple[int, int]:
    """``--num-shards/--shard-index``, defaulting to the Slurm array variables, else one task. A task id is its
    place in the array: ``(SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP`` (``--array=0-9:2``
    numbers its tasks 0, 2, ..., 8)."""
    given = num_shards is not None
    if num_shards is None:
        num_shards = env("SLURM_ARRAY_TASK_COUNT") or 1
    if shard_index is None:
        task_id = env("SLURM_ARRAY_TASK_ID")
        if task_id is not None:
            first, step = env("SLURM_ARRAY_TASK_MIN"), env("SLURM_ARRAY_TASK_STEP")
            if task_id < first or (task_id - first) % step:
                raise InputError(f"SLURM_ARRAY_TASK_ID={task_id} is not an id of the array that starts at SLURM_ARRAY_TASK_MIN={first} "
                                 f"with step SLURM_ARRAY_TASK_STEP={step}; give --shard-index")  # fmt: skip
            shard_index = (task_id - first) // step
            if not shard_index < num_shards:
                source = "--num-shards" if given else "SLURM_ARRAY_TASK_COUNT"
                raise InputError(f"SLURM_ARRAY_TASK_ID={task_id} is task {shard_index} of the array, and {source} is {num_shards}: "
                                 "give --shard-index, or run the array with as many tasks as shards")  # fmt: skip
        else:
            shard_index = 0
    if num_shards < 1:
        raise InputError(f"--num-shards must be at least 1, got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise InputError(f"--shard-index must be in [0, {num_shards}), got {shard_index}")
    return num_shards, shard_index


def parts_for_task(num_parts: int, num_shards: int, shard_index: int) -> list[int]:
    """The output parts one task owns: round-robin, so every task gets a similar share."""
    return [p for p in range(num_parts) if p % num_shards == shard_index]
