"""Which parts one task of a sharded run owns: ``--num-shards/--shard-index``, defaulting to a Slurm array's."""

from __future__ import annotations

import os

from grtool.errors import GrtoolError


def resolve_sharding(num_shards: int | None, shard_index: int | None) -> tuple[int, int]:
    """``--num-shards/--shard-index``, defaulting to the Slurm array variables, else one task."""
    if num_shards is None:
        num_shards = int(os.environ.get("SLURM_ARRAY_TASK_COUNT", "1"))
    if shard_index is None:
        task_id = os.environ.get("SLURM_ARRAY_TASK_ID")
        # Slurm array ids may start at an offset; SLURM_ARRAY_TASK_MIN tells where.
        offset = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        shard_index = int(task_id) - offset if task_id is not None else 0
    if num_shards < 1:
        raise GrtoolError(f"--num-shards must be at least 1, got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise GrtoolError(f"--shard-index must be in [0, {num_shards}), got {shard_index}")
    return num_shards, shard_index


def parts_for_task(num_parts: int, num_shards: int, shard_index: int) -> list[int]:
    """The output parts one task owns: round-robin, so every task gets a similar share."""
    return [p for p in range(num_parts) if p % num_shards == shard_index]
