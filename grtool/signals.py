"""SIGTERM and SIGINT for every command (DESIGN §8): stop within seconds, leave the output resumable, remove
scratch, exit with the transient code.

The CLI entry point runs every command under :func:`handled`. SIGTERM (Slurm's time limit, ``scancel``, a
preemption) then raises :class:`Stopped` in the main thread, which unwinds through the command's cleanup like any
error: the part being written is abandoned (its temporary files removed; committed parts stay), locks are
released, scratch is removed. At the top, one line says what was done (each output registered with :func:`track`
reports its parts and lets go of its lock; blocks under :func:`noted` add theirs) and how to resume, and the
process exits with ``EXIT_TRANSIENT`` (75) at once, without the interpreter's teardown (seconds on a busy machine). SIGINT (Ctrl-C) stays Python's KeyboardInterrupt:
the same cleanup and the same line, exit 130, so a retry loop that retries on 75 stops when a user presses Ctrl-C.

A step that should rather finish than be cut (a training step, then a checkpoint) runs under :func:`deferred`:
there the first SIGTERM only records the request (:func:`requested`), which the step's loop checks at its next
boundary; a second SIGTERM stops at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from grtool.errors import EXIT_INTERRUPTED, EXIT_TRANSIENT

PARTS_HINT = "run the same command again to resume (finished parts are kept)"  # a stage's parts were being written
PLAIN_HINT = "run the same command again"  # a command without parts (export, eval, report, stats)
DEFAULT_HINT = PARTS_HINT  # the old name


class Stopped(BaseException):
    """SIGTERM, raised in the main thread. Not an ``Exception``: handlers of errors let it through (as they do
    KeyboardInterrupt) while ``finally`` blocks and context managers clean up on its way out."""

    exit_code = EXIT_TRANSIENT

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class Stoppable(Protocol):
    keeps_parts: bool  # its finished parts survive a stop (a stage directory): the hint says so

    def on_stop(self) -> str | None:
        """The run stopped: let go of what is still held (locks), say how far this output got (None: nothing)."""


class _State:
    def __init__(self) -> None:
        self.installed = False
        self.stopping = False  # a Stopped is unwinding: further SIGTERMs are ignored, the cleanup goes on
        self.deferring = 0  # inside deferred(): SIGTERM is recorded, not raised
        self.requested: int | None = None
        self.interrupted = False  # SIGINT came (Typer turns its KeyboardInterrupt into exit code 130)
        self.notes: list[str] = []  # from noted(), as a stop unwound through it
        self.hint: str | None = None  # from note(); else PARTS_HINT when an output with parts is tracked, else PLAIN_HINT
        self.finished = False  # the command's work is over: a signal is only recorded (see work_finished())
        self.late: int | None = None  # the signal recorded after the work finished
        self.cancelled_by: int | None = None  # a SIGTERM that cancelled a running asyncio loop's tasks


_state = _State()
_tracked: list[weakref.ref] = []


def track(obj: Stoppable) -> None:
    """Call ``obj.on_stop()`` when the run stops (held weakly: an output dropped is not reported)."""
    _tracked[:] = [r for r in _tracked if r() is not None]
    _tracked.append(weakref.ref(obj))


@contextlib.contextmanager
def noted(text: str | None = None, hint: str | None = None) -> Iterator[None]:
    """When a stop (SIGTERM, Ctrl-C) unwinds through this block: add ``text`` to the line saying what was done, and
    ``hint`` replaces how to resume (``train``: with --resume)."""
    try:
        yield
    except (Stopped, KeyboardInterrupt):
        note(text, hint)
        raise


def note(text: str | None, hint: str | None = None) -> None:
    """Add ``text`` to the line printed when this run stops; ``hint`` replaces how to resume. For code that can
    only say it once the stop has come (``train``: the step reached, the last checkpoint); else :func:`noted`."""
    if text:
        _state.notes.append(text)
    if hint:
        _state.hint = hint


def progress_lines() -> list[str]:
    """What the outputs of this run hold so far (each tracked output's :meth:`~Stoppable.on_stop`, then the notes);
    called once, when the run stopped."""
    lines = []
    for ref in _tracked:
        obj = ref()
        if obj is None:
            continue
        try:
            line = obj.on_stop()
        except Exception as e:  # a report must never hide the stop itself
            line = f"{type(e).__name__}: {e}"
        if line:
            lines.append(line)
    return lines + _state.notes


def stop_message(what: str) -> str:
    """``what`` (stopped by SIGTERM, interrupted), then what was done and how to resume, on one line."""
    done = "; ".join(progress_lines()) or "nothing was finished yet"
    parts = any(getattr(ref(), "keeps_parts", False) for ref in _tracked)
    return f"{what}: {done}; {_state.hint or (PARTS_HINT if parts else PLAIN_HINT)}"


def requested() -> int | None:
    """The signal received inside :func:`deferred`, if any: the loop should stop at its next boundary."""
    return _state.requested


def stop_if_requested() -> None:
    """At a step's boundary: raise the stop that :func:`deferred` held back, if one came."""
    if _state.requested is not None:
        _state.stopping = True
        raise Stopped(_state.requested)


def _on_term(signum: int, _frame: Any) -> None:
    if _state.finished:
        _state.late = _state.late or signum  # the outputs are complete: nothing to unwind, the exit code says it
        return
    if _state.stopping:
        return  # already unwinding: let the cleanup finish (a scheduler's SIGKILL ends it if it takes too long)
    if _state.deferring and _state.requested is None:
        _state.requested = signum
        from grtool.log import log

        log.warning("%s received: stopping after the current step (send it again to stop at once)", signal.Signals(signum).name)
        return
    _state.stopping = True
    loop = _running_loop()
    if loop is not None:  # raised here it could land in one of the loop's callbacks, which swallow it (and the stop)
        _state.cancelled_by = signum
        for task in _all_tasks(loop):
            task.cancel()  # as asyncio.run does for Ctrl-C: the tasks unwind, asyncio.run raises CancelledError
        loop.call_soon_threadsafe(lambda: None)  # wake the loop out of its select()
        return
    raise Stopped(signum)


def _running_loop() -> Any:
    asyncio = sys.modules.get("asyncio")
    return asyncio._get_running_loop() if asyncio is not None else None


def _all_tasks(loop: Any) -> set:
    import asyncio

    return asyncio.all_tasks(loop)


def _on_int(signum: int, frame: Any) -> None:
    if _state.finished or _state.stopping:
        _state.late = _state.late or signum
        return
    _state.interrupted = True
    signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as always


def interrupted() -> bool:
    """Whether SIGINT (Ctrl-C) came during this command."""
    return _state.interrupted


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, the first SIGTERM is recorded (see :func:`requested`) instead of raised; a second one raises."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1


EARLY_LINE = b"stopped: SIGTERM received while the command was starting: nothing was written; run the same command again (exit 75)\n"


EARLY_INT_LINE = b"stopped: SIGINT received while the command was starting: nothing was written (exit 130)\n"


def _on_early_term(signum: int, _frame: Any) -> None:
    os.write(2, EARLY_LINE)  # nothing else is safe to use yet, and nothing needs cleaning up
    os._exit(EXIT_TRANSIENT)


def _on_early_int(signum: int, _frame: Any) -> None:
    os.write(2, EARLY_INT_LINE)  # Ctrl-C among the imports: one line and 130, not a KeyboardInterrupt traceback
    os._exit(EXIT_INTERRUPTED)


def install_early() -> None:
    """From the first line of the ``grtool`` command: a SIGTERM while its modules load (a second, more on a busy
    node) ends the process with the transient code too, not by the signal; :func:`handled` takes over."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_early_term)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_early_int)


def work_finished() -> None:
    """The command's work is over (its outputs complete, or its error decided): from here a SIGTERM or SIGINT is
    only recorded, and :func:`exit_now` ends the process with the transient code (130 for SIGINT) instead of the
    command's own, while the handlers stay in place until the process is gone (never killed by the signal)."""
    _state.finished = True


@contextlib.contextmanager
def handled(ends_process: bool = False) -> Iterator[None]:
    """Run a command with SIGTERM turned into :class:`Stopped`; the outermost one prints the line and ends the
    process with the transient code. Nested uses (the index build, run by the CLI or a pipeline) change nothing;
    outside the main thread, or where someone else installed a handler, it stays out of the way.

    ``ends_process`` (the ``grtool`` command): the command's exit (``sys.exit``) ends the process here through
    :func:`exit_now`, with the handlers still installed, so a signal landing after the work never kills it."""
    ours = (signal.SIG_DFL, _on_early_term)
    if _state.installed or threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in ours:
        yield
        return
    signal.signal(signal.SIGTERM, _on_term)
    own_int = signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _on_early_int)
    if own_int:
        signal.signal(signal.SIGINT, _on_int)
    _state.installed = True
    try:
        yield
    except SystemExit as e:
        if not ends_process:
            raise
        exit_now(_exit_code(e), teardown=True)
    except Stopped as e:
        finish(e)
    except BaseException as e:
        # raised inside an asyncio/anyio task group (the openai backend's requests): a Stopped in a group
        stop = _stop_in(e) if isinstance(e, BaseExceptionGroup) else None
        if stop is None and _state.cancelled_by is not None and _is_cancelled(e):
            stop = Stopped(_state.cancelled_by)  # the asyncio tasks a SIGTERM cancelled (see _on_term)
        if stop is None and ends_process and isinstance(e, Exception):  # a crash: its traceback, then the same exit path
            import traceback

            traceback.print_exc()
            exit_now(1, teardown=True)
        if stop is None:
            raise
        finish(stop)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if own_int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _state.__init__()


def run_async(main: Any) -> Any:
    """``asyncio.run(main)``, where a SIGTERM (which cancels the loop's tasks, see ``_on_term``) comes out as
    :class:`Stopped`, as anywhere else: callers that tell a stop from a failure (the pipeline) see it as one."""
    import asyncio

    try:
        return asyncio.run(main)
    except BaseException as e:
        if _state.cancelled_by is not None and _is_cancelled(e):
            raise Stopped(_state.cancelled_by) from None
        raise


def _is_cancelled(e: BaseException) -> bool:
    """A CancelledError (alone or in an exception group) came out of an asyncio loop."""
    import asyncio

    if isinstance(e, BaseExceptionGroup):
        return e.subgroup(lambda x: isinstance(x, asyncio.CancelledError)) is not None
    return isinstance(e, asyncio.CancelledError)


def _stop_in(group: BaseExceptionGroup) -> Stopped | None:
    """The :class:`Stopped` inside an exception group, if any: a SIGTERM that lands while a task group runs comes
    out wrapped in one."""
    found: BaseException | None = group.subgroup(lambda e: isinstance(e, Stopped))
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found if isinstance(found, Stopped) else None


def finish(stop: Stopped) -> None:
    """Print what was done and how to resume; end the process with the transient code."""
    from rich.markup import escape

    from grtool.log import console

    name = signal.Signals(stop.signum).name
    console.print(f"[bold yellow]stopped:[/] {escape(stop_message(f'{name} received'))} (exit {stop.exit_code})",
                  highlight=False, soft_wrap=True)  # fmt: skip
    exit_now(stop.exit_code)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)  # sys.exit("text"): Python prints it and exits 1
    return 1


LATE_LINE = "stopped: {name} received after the command's work was done{what}; exit {code} as for any stop"


def exit_now(code: int, teardown: bool = False) -> None:
    """End the process with ``code`` once the cleanup has run, without the interpreter's finalization, which resets
    the signal handlers to the default (a signal then kills the process) and takes seconds with torch loaded.

    ``teardown``: a command that ended by itself: its other threads are joined and the exit callbacks run (temporary
    directories, multiprocessing children), as the interpreter would. Meanwhile, and until the end, a SIGTERM or
    SIGINT is recorded: the exit code becomes 75 (130), the outputs being complete."""
    _state.finished = True
    if teardown:
        # What the interpreter does first at exit: its thread-exit hooks (executors told to stop), then every
        # non-daemon thread joined.
        threading._shutdown()  # type: ignore[attr-defined]
        import atexit

        atexit._run_exitfuncs()  # what the interpreter runs at exit, while our handlers still record signals
        from grtool.errors import GrtoolError
        from grtool.holds import hold

        try:
            hold("exiting")
        except GrtoolError:  # GRTOOL_HOLD naming a directory that is not there: leaving must not fail on it (a traceback)
            pass
    else:
        mp = sys.modules.get("multiprocessing")
        if mp is not None and mp.active_children():  # children of ours (a vLLM engine): their exit callback stops them
            import atexit

            atexit._run_exitfuncs()
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # from here a signal waits: it is checked below
    pending = signal.sigpending()
    late = _state.late or next((s for s in (signal.SIGTERM, signal.SIGINT) if s in pending), None)
    if late is not None and _state.installed and not (_state.stopping or _state.interrupted):  # the first stop's code stays
        final = EXIT_INTERRUPTED if late == signal.SIGINT else EXIT_TRANSIENT
        what = "" if code in (0, final) else f" (it had ended with exit {code})"
        name = signal.Signals(late).name
        try:
            os.write(2, (LATE_LINE.format(name=name, what=what, code=final) + "\n").encode())
        except OSError:
            pass
        code = final
    os._exit(code)
