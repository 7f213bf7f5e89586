"""Exit codes a script can act on, and SIGTERM for every long command (issue 26, items 9 and 10).

- 75 (EX_TEMPFAIL) means "try the same command again later": a server down after the retries, an output locked
  by another run, a SIGTERM (a typo stays 2, a data problem 1: the tests of those errors check their codes).
- SIGTERM (Slurm's time limit, scancel) stops a stage within seconds: the part in flight is abandoned, its
  temporary files removed, one line says how far the run got, exit 75; the same command then resumes and ends
  with the same rows as a run never stopped.

The model is a small OpenAI-compatible HTTP server on 127.0.0.1 (stdlib), slowed down where a test needs time
to send the signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grtool.errors import EXIT_TRANSIENT
from grtool.store.locks import RunLock
from grtool.store.stage import read_table
from llm_helpers import TitleTripleServer, free_port, write_documents

DOCS = [{"doc_id": f"d{i:02d}", "title": f"Title {i}", "text": f"Document number {i}.", "datasets": ["test"]} for i in range(6)]


def _extract(documents: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["triples", "extract", "--grounding", "off", str(documents), "--out", str(out), "--backend", "openai", "--base-url", url,
            "--concurrency", "1", "--max-retries", "1", "--timeout", "5", *extra]  # fmt: skip


def _rows(stage: Path) -> list[tuple]:
    return sorted((r["doc_id"], r["head"], r["relation"], r["tail"]) for r in read_table(stage).to_pylist())


@pytest.fixture
def documents(tmp_path) -> Path:
    return write_documents(tmp_path / "documents", DOCS, num_parts=3)


HELD = ("--timeout", "600")  # a held request waits for the signal, never for a client's timeout


def _sigterm_when(proc: subprocess.Popen, ready) -> str:
    """Wait until ``ready()`` (a state: the child still running and held there), send it SIGTERM; its stderr. No
    clock: the child either reaches the state or ends (then the test fails with its output)."""
    try:
        while not ready():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)  # only a guard against a hang
        return err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigterm_stops_a_stage_resumably_with_the_transient_code(tmp_path, documents, cli):
    out = tmp_path / "out"
    with TitleTripleServer(hold_after=2) as server:  # part 0's two documents are answered; part 1's first waits
        cmd = [sys.executable, "-m", "grtool", *_extract(documents, out, server.url, *HELD)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "10000"})
        # the first part is committed and the second part's first request is held in flight
        err = _sigterm_when(proc, lambda: server.holding.is_set() and (out / "triples" / "_shards" / "part-00000.json").exists())
        assert proc.returncode == EXIT_TRANSIENT, err
        said = " ".join(err.split())
        assert "Traceback" not in err
        assert f"SIGTERM received: {out / 'triples'}: 1 of 3 parts done" in said and "run the same command again to resume" in said, err
        assert f"{out / 'llm_calls'}: 1 of 3 parts done" in said and "(exit 75)" in said, err
        left = [p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name.startswith("_run")]
        assert not left, f"temporary files or run locks left behind: {left}"
        assert not (out / "triples" / "part-00001.parquet").exists()

        # The same command again: only the missing parts are done, and the rows are those of an uninterrupted run.
        server.release()
        again = cli(*_extract(documents, out, server.url), env={"COLUMNS": "10000"})
        assert "2 parts done, 1 already done" in " ".join(again.stderr.split()), again.stderr
    assert _rows(out / "triples") == [(d["doc_id"], d["title"], "is a", "document") for d in DOCS]
    cli("validate", out)


def test_sigterm_while_streaming_to_stdout_does_not_promise_a_resume(tmp_path, documents):
    """--out -: the rows already streamed belong to the reader and nothing is kept, so the stop line counts them
    and says the run starts over (not "finished parts are kept")."""
    with TitleTripleServer(hold_after=2) as server:
        args = _extract(documents, Path("-"), server.url, *HELD, "--cache-dir", str(tmp_path / "cache"))  # no answer from an earlier run
        proc = subprocess.Popen([sys.executable, "-m", "grtool", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "COLUMNS": "10000"})  # fmt: skip
        try:
            first = proc.stdout.readline()  # a row is out: the stream has begun
            server.holding.wait(300)  # the next part's request is held: nothing more comes until the signal
            proc.send_signal(signal.SIGTERM)
            rest, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): it skips what readline buffered
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == EXIT_TRANSIENT and first, err
    said = " ".join(err.split())
    rows = len((first + rest).splitlines())
    assert f"SIGTERM received: {rows} triples rows written to standard output (a stream is not resumed)" in said, err
    assert "finished parts are kept" not in said and "to start over" in said, err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's signal mask from /proc")
def test_sigterm_while_the_command_is_still_loading_exits_with_the_transient_code(tmp_path):
    """Between the start of `grtool` and the command running lie a second or more of imports: a SIGTERM there (a
    job cancelled as it starts) exits 75 as well, so a requeue-on-75 script requeues it, instead of dying by the
    signal (143)."""
    holds = tmp_path / "holds"
    holds.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "grtool", "corpus", "stats", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "GRTOOL_HOLD": f"starting:{holds}"})  # fmt: skip
    err = _sigterm_when(proc, (holds / "starting.reached").exists)  # held before the imports (grtool.holds)
    assert proc.returncode == EXIT_TRANSIENT, err
    assert "SIGTERM received while the command was starting: nothing was written" in err, err


def test_an_unreachable_server_exits_with_the_transient_code(tmp_path, documents, cli):
    closed = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    # With --model: every request fails to connect, retried, then given up.
    proc = cli(*_extract(documents, tmp_path / "a", closed, "--model", "toy-model"), check=EXIT_TRANSIENT, env={"COLUMNS": "10000"})
    assert "giving up after 2 attempts" in proc.stderr and "ConnectError" in proc.stderr, proc.stderr
    # Without: the served model cannot be listed.
    proc = cli(*_extract(documents, tmp_path / "b", closed), check=EXIT_TRANSIENT, env={"COLUMNS": "10000"})
    message = " ".join(proc.stderr.split())
    assert f"{closed}: the server is unreachable" in message and "cannot list the served models" in message, proc.stderr
    assert "pass --model" not in message, proc.stderr  # naming a model would not make the server answer


def test_a_key_no_server_could_take_is_a_usage_error_not_transient(tmp_path, documents, cli):
    """An API key that cannot go into a header fails the same way on every attempt: exit 2 at once, not 75 (a
    requeue loop would retry it forever). A --base-url no request could go to (no scheme, a wrong one, a bad port)
    is refused with the options, before OUT is created: tests/cli/test_options.py."""
    with TitleTripleServer() as server:
        for model in ((), ("--model", "toy-model")):
            proc = cli(*_extract(documents, tmp_path / "c", server.url, *model), check=2, env={"COLUMNS": "10000", "OPENAI_API_KEY": "sk-hidden\nkey"})
            assert "Illegal header value" in proc.stderr and "giving up" not in proc.stderr, proc.stderr
            # the key, shown escaped in that message, is scrubbed there and in the stop recorded in the manifest
            assert "hidden" not in proc.stderr and "hidden" not in (tmp_path / "c" / "triples" / "_manifest.json").read_text(), proc.stderr
        assert server.posts == 0


def test_an_output_held_by_another_run_exits_with_the_transient_code(tmp_path, documents, cli):
    out = tmp_path / "out"
    with RunLock(out / "triples", command=["grtool", "a", "live", "run"]):  # this process is the live run
        proc = cli(
            *_extract(documents, out, f"http://127.0.0.1:{free_port()}/v1", "--model", "toy-model"), check=EXIT_TRANSIENT, env={"COLUMNS": "10000"}, process=True
        )  # a lock is per process: the command needs one of its own
    said = " ".join(proc.stderr.split())
    assert f"pid {os.getpid()}" in said and "grtool a live run" in said and "then run again" in said, proc.stderr


def test_sigterm_stops_a_pipeline_with_its_summary_and_the_transient_code(tmp_path, documents):
    out = tmp_path / "out"
    config = tmp_path / "pipe.toml"
    with TitleTripleServer(hold_after=2) as server:
        config.write_text(
            f'out = "{out}"\n'
            f'[[stages]]\nname = "extract"\nrun = "triples extract"\nargs = ["{documents}"]\n'
            f'options = {{ out = "{{out}}/extract", grounding = "off", backend = "openai", base_url = "{server.url}", concurrency = 1, timeout = 600 }}\n'
            f'[[stages]]\nname = "check"\nrun = "validate"\nargs = ["{{out}}/extract"]\n'
        )
        proc = subprocess.Popen([sys.executable, "-m", "grtool", "pipeline", "run", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, env={**os.environ, "COLUMNS": "10000"})  # fmt: skip
        err = _sigterm_when(proc, lambda: server.holding.is_set() and (out / "extract" / "triples" / "_shards" / "part-00000.json").exists())
    assert proc.returncode == EXIT_TRANSIENT, err
    said = " ".join(err.split())
    assert "pipeline stopped at stage extract (exit code 75)" in said and "stopped: grtool triples extract" in said and "left: check" in said, err
    assert f"SIGTERM received: {out / 'extract' / 'triples'}: 1 of 3 parts done" in said and "Traceback" not in err, err
    assert not (out / "_pipeline" / "extract.json").exists()  # not marked done: the next run resumes it


def test_sigterm_inside_an_asyncio_task_group_still_stops_with_the_transient_code():
    """The openai backend sends its requests from an asyncio task group: a SIGTERM landing there comes out wrapped
    in an exception group, which must end the run as any SIGTERM does (75 and the stop line), not as a crash (1)."""
    script = (
        "import asyncio, os, signal\n"
        "from grtool import signals\n"
        "async def requests():\n"
        "    async def one():\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        await asyncio.sleep(5)\n"
        "    async with asyncio.TaskGroup() as group:\n"
        "        group.create_task(one())\n"
        "        group.create_task(asyncio.sleep(5))\n"
        "with signals.handled():\n"
        "    asyncio.run(requests())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_TRANSIENT, proc.stderr
    assert "stopped: SIGTERM received" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# Ctrl-C while the command is still starting (among its imports) is one line and exit 130, as SIGTERM
# there is 75 (it was a KeyboardInterrupt traceback and death by the signal)
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 75)])
def test_signal_while_starting(tmp_path, sig, code):
    holds = tmp_path / "holds"
    holds.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "grtool", "validate", tmp_path], env={**os.environ, "GRTOOL_HOLD": f"starting:{holds}"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    while not (holds / "starting.reached").exists():
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(sig)
    (holds / "starting.release").touch()
    err = proc.communicate(timeout=60)[1]  # a guard against a hang only
    assert proc.returncode == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
