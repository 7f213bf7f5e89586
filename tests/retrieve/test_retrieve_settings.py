"""`grtool retrieve`'s settings without a model run: sampling, the system prompt, few-shot sources, flips, latency."""

from __future__ import annotations

import pytest
from checkpoint_records import checkpoint_record_bytes

from grtool.retrieve.run import sampling_temperature
from grtool.retrieve.stage import RetrieveSettings


def test_one_sample_at_a_temperature_is_sampled_and_seeded():
    """--samples 1 --temperature 0.8 samples (seed --seed); without --temperature one sample stays greedy."""
    sampled = RetrieveSettings(samples=1, temperature=sampling_temperature(1, 0.8), seed=5).sampling(0, {})
    assert (sampled.temperature, sampled.seed) == (0.8, 5)
    assert RetrieveSettings(samples=1, temperature=sampling_temperature(1, None)).sampling(0, {}).temperature == 0.0
    assert sampling_temperature(4, None) > 0  # several samples without --temperature: sampled
    assert sampling_temperature(4, 0.0) == 0.0  # (refused by retrieve: N copies of the greedy response)


def test_system_prompt_is_the_one_export_sft_trains_with(tmp_path):
    """--system comes first, as in the rows `export sft --system` writes; --mode gmr (no system in `export gmr`) refuses it."""
    from pathlib import Path

    from conftest import run_cli

    from grtool.vocab.prompt import instruction
    from grtool.export.formats import sft_row
    from grtool.retrieve.run import RetrieveRequest, retrieve_prompt

    request = RetrieveRequest(corpus="unused", index=Path("unused"), out=tmp_path / "out", few_shot=0, system="Answer with docids.")
    sent = retrieve_prompt(request, None).messages("q1", "Who wrote it?")
    trained = sft_row("trl-messages", instruction("Who wrote it?", "special"), "answer", "Answer with docids.")["messages"]
    assert sent == trained[:-1]
    assert retrieve_prompt(request, None).sha256() != retrieve_prompt(RetrieveRequest(corpus="unused", index=Path("unused"), out=tmp_path / "out", few_shot=0), None).sha256()
    # (a corpus not there: an existing directory that holds none is refused first, as what it is)
    proc = run_cli("retrieve", tmp_path / "corpus", "--index", tmp_path / "index", "--mode", "gmr", "--system", "x", "--out", tmp_path / "out", check=2)
    assert "--system" in proc.stderr and "export gmr" in proc.stderr and not (tmp_path / "out").exists()


def test_train_records_flips_and_retrieve_refuses_an_index_without(samples, tmp_path):
    """`train` records whether its chains had flipped docids (a stage, or the stage an export file's record names;
    a KTO run inherits it from its SFT checkpoint); `retrieve` with such a model refuses an index built without
    --flips, with the command that fixes it, and takes the other way round."""
    import shutil

    from conftest import run_cli
    from grtool.store.schemas import CHAINS
    from sample_helpers import write_stage
    from sample_helpers import write_chains

    from grtool.errors import InputError
    from grtool.index.base import Index
    from grtool.retrieve.run import check_flips
    from grtool.train.data import data_flips
    from grtool.vocab.provenance import checkpoint_flips
    from grtool.train.run import learned_flips

    forward = tmp_path / "forward"
    write_chains(samples, forward)  # no flipped docid
    rows = [{**r, "flipped": [True] if r["selected"] else []} for r in _rows(forward)]
    write_stage(tmp_path / "flipped", "chains", CHAINS, rows)
    write_stage(tmp_path / "unkept", "chains", CHAINS, [{**r, "flipped": [not r["selected"]]} for r in _rows(forward)])
    assert (data_flips(forward), data_flips(tmp_path / "flipped"), data_flips(tmp_path / "unkept")) == (False, True, False)
    export = tmp_path / "sft.json"
    run_cli("export", "sft", tmp_path / "flipped", "--corpus", samples["root"], "--out", export)
    assert data_flips(export) is True  # through the export's .grtool.json
    shutil.copy(export, tmp_path / "bare.json")
    assert data_flips(tmp_path / "bare.json") is None  # unknown, not False

    sft = tmp_path / "ckpt"
    sft.mkdir()
    (sft / "grtool.json").write_bytes(checkpoint_record_bytes(flips=learned_flips(_plan(export, "base"))))
    assert checkpoint_flips(sft) is True
    assert learned_flips(_plan(tmp_path / "bare.json", sft)) is True  # KTO on the SFT checkpoint: it learned them

    run_cli("index", "build", samples["root"] / "triples", "--tokenizer", "default", "--out", tmp_path / "plain")
    run_cli("index", "build", samples["root"] / "triples", "--tokenizer", "default", "--flips", "--out", tmp_path / "with_flips")
    with pytest.raises(InputError, match=r"without --flips.*grtool index build .* --flips"):
        check_flips(Index.open(tmp_path / "plain"), str(sft), None, samples["root"] / "triples")
    check_flips(Index.open(tmp_path / "with_flips"), str(sft), None, samples["root"] / "triples")
    (sft / "grtool.json").write_bytes(checkpoint_record_bytes(flips=False))
    check_flips(Index.open(tmp_path / "with_flips"), str(sft), None, samples["root"] / "triples")  # harmless: a note
    check_flips(Index.open(tmp_path / "plain"), str(sft), None, samples["root"] / "triples")


def _rows(path):
    from grtool.store.stage import read_table

    return read_table(path).to_pylist()


def _plan(data, model):
    from types import SimpleNamespace

    return SimpleNamespace(data=SimpleNamespace(source=str(data)), model=SimpleNamespace(path=str(model)))


def test_brackets_with_a_grtool_checkpoint_default_to_no_worked_examples(samples, tmp_path):
    """`retrieve --markers brackets` puts 3 worked examples before an off-the-shelf model's question, but a model
    `grtool train` wrote (grtool.json beside its weights, or beside its adapter) learned the bare instruction
    (`export sft --markers brackets` rows have no examples): by default it gets exactly that prompt."""
    from pathlib import Path

    from grtool.vocab.prompt import instruction
    from grtool.retrieve.run import RetrieveRequest, retrieve_prompt, trained_by_grtool

    ckpt, plain = tmp_path / "ckpt", tmp_path / "plain"
    for folder in (ckpt, plain, ckpt / "adapter"):
        folder.mkdir(parents=True)
    (ckpt / "grtool.json").write_bytes(checkpoint_record_bytes())
    assert trained_by_grtool(str(ckpt), None) and trained_by_grtool(None, ckpt / "adapter")
    assert not trained_by_grtool(str(plain), None) and not trained_by_grtool(None, None) and not trained_by_grtool("HuggingFaceTB/x", None)

    def prompt(model: Path | None, **given):
        request = RetrieveRequest(corpus=str(samples["root"]), index=Path("unused"), out=tmp_path / "out", markers="brackets", few_shot_from="dev", **given)
        return retrieve_prompt(request, samples["root"] / "triples", (), trained=trained_by_grtool(str(model) if model else None, None))

    assert prompt(None).k == 3 and prompt(plain).k == 3  # an off-the-shelf model: worked examples
    trained = prompt(ckpt)
    assert trained.k == 0 and trained.messages("q1", "Who?") == [{"role": "user", "content": instruction("Who?", "brackets")}]
    assert prompt(ckpt, few_shot=2).k == 2  # asked for: given


def test_degenerate_answers_count_as_empty():
    """A model with broken weights writes only end-of-text tokens, which decoding keeps beside the docid markers:
    the empty-output guard counts such answers as empty (before: as answers, so the guard never tripped)."""
    from grtool.retrieve.stage import degenerate

    for text in ("", "  \n", "<|endoftext|>" * 40, "<|im_end|>\n<|endoftext|>", "</s></s>", "<eos><pad>"):
        assert degenerate(text), text
    for text in ("<docid_start>Ada Lovelace, place of birth, London<docid_end>", "[Ada, born in, London]", "no answer <|endoftext|>"):
        assert not degenerate(text), text
