"""Named points where a test holds a running command, so tests of locks and signals wait for a state, never race
a clock (a process that finished between a test's poll and its signal made one such test fail on a loaded machine).

``GRTOOL_HOLD=POINT:DIR``: a process reaching :func:`hold` with that POINT writes its pid to ``DIR/POINT.reached``
and waits until ``DIR/POINT.release`` exists. Signals are handled while it waits (SIGTERM stops it as anywhere
else). Unset, as in every real run, a point costs one environment lookup.

Points: ``starting`` (the ``grtool`` command, before its modules are imported); ``locked`` (a run holds its output's lock, before it reads or writes anything); ``training`` (`train`
holds its --out and has written its run record there, before the model loads); ``saving`` (`train` has written a
checkpoint under its temporary name and not yet renamed it into place; a SIGTERM there is kept, as anywhere in
training, and stops the run after its next step); ``recorded`` (a file written whole, an export, has its record
written and is not yet renamed into place); ``committed`` (a stage's part and its
shard record are committed, the next part not begun); ``spilled`` (`corpus ingest` has read every input into its
bucket files and not yet written the plan that lets a resumed run reuse them); ``finished`` (the
command's work is done, its outputs complete); ``exiting`` (its exit callbacks have run, the process ends next).
"""

from __future__ import annotations

import os
import time

from grtool.errors import InputError

VARIABLE = "GRTOOL_HOLD"


def hold(point: str) -> None:
    """Wait here while the environment asks to hold ``point`` (see the module docstring)."""
    if not os.environ.get(VARIABLE):  # every real run: one lookup
        return
    from grtool.userinput import env

    try:
        name, directory = env(VARIABLE)
    except InputError:  # already refused when the command started; the exit path must not fail on it again
        return
    if name != point:
        return
    if not directory.is_dir():
        raise InputError(f"{VARIABLE}: {directory} is not a directory")
    scratch = directory / f".{point}.reached.{os.getpid()}"
    scratch.write_text(str(os.getpid()))
    os.replace(scratch, directory / f"{point}.reached")  # whole when it appears: a test reads the pid at once
    release = directory / f"{point}.release"
    while not release.exists():
        time.sleep(0.01)
