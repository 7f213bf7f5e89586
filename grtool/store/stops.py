"""Why a stage run stopped: the manifest's ``stops`` record, and its explicit acceptance.

A stage command that fails after its stage directory exists (a guard such as ``--max-empty-share`` tripped, or
any other error) may leave every part committed: the rows alone look complete. So the failure is written into
the manifest of every stage directory the command opened for writing, keyed by the task that failed::

    "stops": {
      "all": {                      # a whole run; an array task is "I/N" (--shard-index I --num-shards N)
        "task": "all",
        "kind": "guard",            # or "error": any other fatal stop
        "guard": "--max-empty-share",   # null for an error
        "numbers": {"part": "part-00000", "empty": 4, "total": 6, "share": 0.6667, "max_empty_share": 0.2, ...},
        "message": "part-00000: 4 of 6 documents gave no triples (67% > --max-empty-share 0.2) ...",
        "exit_code": 1,
        "when": "2025-01-01T12:00:00+00:00",
        "command": ["grtool", "triples", "extract", ...],
        "accepted": null            # or {"by": "user@host", "when": ..., "command": [...], "reason": ...}
      }
    }

`grtool status` shows a stop, `grtool validate` fails the stage on one that is not accepted. The record goes
when the same task (or a whole run) of the stage runs again and succeeds; ``grtool validate DIR --accept``
accepts the stops recorded under DIR. A manifest without the field (older grtool) has no stops.

An interruption (Ctrl-C, SIGTERM) is not a failure: the run is resumable and the parts it did not finish are
already visible as pending, so it neither records a stop nor clears one. A stage command signals failure by
raising, never by returning a non-zero exit code (a returned non-zero code is taken for an interruption).

How it is wired: :func:`grtool.store.frames.recording` wraps one grtool command (the CLI entry point; each stage
of `grtool pipeline run`); every :class:`~grtool.store.stage.StageWriter` opened inside it registers with
:func:`~grtool.store.frames.opened`; the block failing records the stop in each of them (:func:`record_stop`),
the block succeeding clears their task's stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from grtool.invocation import current_command
from grtool.store.layout import LOCK, MANIFEST
from grtool.store.records import Manifest, StopRecord, dumps, load_manifest, now, write_record

STOPS = "stops"  # the manifest's field
WHOLE_RUN = "all"  # the task key of a run that is not one task of an array
MAX_MESSAGE = 4000  # characters of an error message kept in the record


def task_key(shards: tuple[int, int] | None) -> str:
    """``"all"`` for a whole run, ``"I/N"`` for task I of an N-task array."""
    if shards is None or shards[0] <= 1:
        return WHOLE_RUN
    count, index = shards
    return f"{index}/{count}"


# ------------------------------------------------------------------------------------------ reading


SHOWN_CHARS = 400  # of the message, in status and validate lines (the record keeps it whole)


def describe(stop: StopRecord) -> str:
    """One line: what stopped the run, which task, when, the command."""
    what = f"guard {stop.guard} tripped" if stop.kind == "guard" else f"run failed (exit {stop.exit_code})"
    task = "" if stop.task == WHOLE_RUN else f" in task {stop.task} (--shard-index/--num-shards)"
    message = stop.message
    if len(message) > SHOWN_CHARS:
        message = message[:SHOWN_CHARS] + " …"
    return f"{what}{task} at {stop.when}: {message} [command: {' '.join(stop.command)}]"


def describe_acceptance(stop: StopRecord) -> str:
    acc = stop.accepted
    if acc is None:
        return describe(stop)
    reason = f" ({acc.reason})" if acc.reason else ""
    return f"accepted by {acc.by} at {acc.when}{reason}: {describe(stop)}"


# ------------------------------------------------------------------------------------------ writing


def _update(path: Path, change) -> Any:
    """Apply ``change(stops) -> result`` to the manifest's stops under the manifest lock (the one shard merges
    take), writing the manifest only when the stops changed."""

    from filelock import FileLock  # only writers take the lock (`status` reads the stops without it)

    with FileLock(str(path / LOCK)):
        # rewritten from the JSON form of what was read (fields a newer grtool added are not kept)
        manifest = msgspec.to_builtins(load_manifest(path))
        stops = dict(manifest[STOPS] or {})
        before = dumps(stops)
        result = change(stops)
        if dumps(stops) != before:
            manifest[STOPS] = stops
            write_record(path / MANIFEST, manifest, Manifest, "manifest")
    return result


def stop_record(exc: BaseException, task: str, command: list[str]) -> dict[str, Any]:
    """The stop record of ``exc`` ending a run of ``task`` (a :class:`~grtool.errors.GuardTripped` is a guard)."""
    from grtool.secrets import scrub

    guard = getattr(exc, "guard", None)
    numbers = getattr(exc, "numbers", None)
    code = getattr(exc, "exit_code", None)
    message = str(exc) or (f"exit code {code}" if code is not None else type(exc).__name__)
    if not hasattr(exc, "exit_code"):  # not an error meant for the user: say what it was
        message = f"{type(exc).__name__}: {message}"
    return {
        "task": task,
        "kind": "guard" if isinstance(guard, str) else "error",
        "guard": guard if isinstance(guard, str) else None,
        "numbers": dict(numbers) if isinstance(numbers, dict) else {},
        "message": scrub(message)[:MAX_MESSAGE],
        "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else 1,
        "when": now(),
        "command": list(command),
        "accepted": None,
    }


def record_stop(path: str | Path, stop: dict[str, Any]) -> None:
    """Write ``stop`` as its task's record (replacing an earlier one of that task, accepted or not)."""
    _update(Path(path), lambda stops: stops.__setitem__(stop["task"], stop))


def clear_stops(path: str | Path, task: str) -> None:
    """A run of ``task`` succeeded: its stop goes; a whole run's success clears every task's."""

    def change(stops: dict[str, Any]) -> None:
        if task == WHOLE_RUN:
            stops.clear()
        else:
            stops.pop(task, None)

    _update(Path(path), change)


def accept_stops(path: str | Path, reason: str | None = None) -> list[StopRecord]:
    """Mark every stop of the stage directory nobody accepted yet as accepted (who, when, the command, why);
    returns those it accepted."""

    acceptance = {"by": _who(), "when": now(), "command": current_command(), "reason": reason}

    def change(stops: dict[str, Any]) -> list[dict[str, Any]]:
        done = []
        for key, stop in sorted(stops.items()):
            if stop.get("accepted") is None:
                stops[key] = {**stop, "accepted": acceptance}
                done.append(stops[key])
        return done

    return [msgspec.convert(stop, StopRecord) for stop in _update(Path(path), change)]  # as written: it decoded


def _who() -> str:
    import getpass  # here: only a stop being written names its user and host
    import socket

    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment or the password database (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"
