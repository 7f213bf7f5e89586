"""Which parts one task of a sharded run owns: ``--num-shards/--shard-index``, defaulting to a Slurm array's."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from grtool.errors import GrtoolError, InputError

MAX_ARRAY_TASKS = 4_000_001  # Slurm's own upper limit of MaxArraySize
_INTEGER = re.compile(r"-?[0-9]{1,10}", re.ASCII)


def _slurm_int(environ: Mapping[str, str], name: str, low: int, high: int) -> int:
    text = environ[name]
    if not _INTEGER.fullmatch(text) or not low <= int(text) <= high:
        raise InputError(f"${name}={text!r}: expected an integer from {low} to {high} (Slurm sets it in an array task; "
                         f"or give --num-shards/--shard-index)")  # fmt: skip
    return int(text)


def slurm_array_task(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(task count, this task's index from 0)`` from a Slurm array task's variables (``SLURM_ARRAY_TASK_COUNT``,
    ``SLURM_ARRAY_TASK_ID``, less ``SLURM_ARRAY_TASK_MIN`` where the array starts above 0); None outside an
    array. A variable that is not a bounded integer, or an index outside the count, is a usage error (exit 2)."""
    environ = os.environ if environ is None else environ
    names = ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID")
    if not any(n in environ for n in names):
        return None
    if "SLURM_ARRAY_TASK_COUNT" not in environ:
        raise InputError("$SLURM_ARRAY_TASK_ID is set but $SLURM_ARRAY_TASK_COUNT is not: give --num-shards/--shard-index")
    count = _slurm_int(environ, "SLURM_ARRAY_TASK_COUNT", 1, MAX_ARRAY_TASKS)
    task_id = _slurm_int(environ, "SLURM_ARRAY_TASK_ID", 0, 2 * MAX_ARRAY_TASKS) if "SLURM_ARRAY_TASK_ID" in environ else 0
    start = _slurm_int(environ, "SLURM_ARRAY_TASK_MIN", 0, 2 * MAX_ARRAY_TASKS) if "SLURM_ARRAY_TASK_MIN" in environ else 0
    if not 0 <= task_id - start < count:
        raise InputError(f"$SLURM_ARRAY_TASK_ID={task_id} is outside the array ($SLURM_ARRAY_TASK_MIN={start}, "
                         f"$SLURM_ARRAY_TASK_COUNT={count}): give --num-shards/--shard-index")  # fmt: skip
    return count, task_id - start


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
