"""grtool.index.agreement.check_agreement: a model whose tokenizer disagrees with the index's fails loudly,
naming the mismatch and the exact rebuild command."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from index_helpers import BUNDLED, write_triples_stage
from tokenizers import Tokenizer

from grtool.errors import InputError
from grtool.index.agreement import check_agreement, fix_command
from grtool.index.base import Index
from grtool.index.build import build_index
from grtool.index.tokenizer import load_tokenizer
from grtool.models import DEFAULT_MODEL_NAME

SMOL = DEFAULT_MODEL_NAME


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines()]
    return write_triples_stage(tmp_path_factory.mktemp("run") / "triples", rows)


@pytest.fixture(scope="module")
def llama3_index(stage, tmp_path_factory) -> Index:
    out = tmp_path_factory.mktemp("idx") / "llama3"
    build_index(stage, out, tokenizer="llama3", flips=True)
    return Index.open(out)


def _off_the_shelf_smol() -> Tokenizer:
    """The embedded model's own tokenizer, as transformers loads it: no docid markers."""
    from transformers import AutoTokenizer

    from grtool.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(SMOL).path).backend_tokenizer


def _fix_line(index: Index, stage) -> str:
    return f"grtool index build {shlex.quote(str(stage.resolve()))} --tokenizer {SMOL} --out {shlex.quote(str(index.path))} --flips --overwrite"


@pytest.mark.slow
def test_llama3_index_against_the_smollm2_tokenizer_names_both_and_the_fix(llama3_index, stage):
    trained = load_tokenizer(SMOL).tokenizer  # SmolLM2 with the markers added (as `grtool train sft` leaves it)
    with pytest.raises(InputError) as err:
        check_agreement(llama3_index, trained, SMOL)
    msg = str(err.value)
    assert "tokenizer 'llama3' (vocab 128258, <docid_start>=128256, <docid_end>=128257)" in msg
    assert f"model {SMOL} (vocab 49154) gives <docid_start> 49152, <docid_end> 49153" in msg
    assert msg.endswith("\n" + _fix_line(llama3_index, stage)) and fix_command(llama3_index, SMOL) == _fix_line(llama3_index, stage)
    # brackets: no markers needed, but the vocabulary still differs
    with pytest.raises(InputError, match=r"docid '.*' tokenizes to \[.*\] with the index's tokenizer vs \[.*\] with the model's") as err:
        check_agreement(llama3_index, _off_the_shelf_smol(), SMOL, markers="brackets")
    assert str(err.value).endswith(_fix_line(llama3_index, stage))


def test_the_same_tokenizer_agrees(llama3_index):
    check_agreement(llama3_index, load_tokenizer("llama3").tokenizer, "llama3")
    check_agreement(llama3_index, llama3_index.tokenizer.tokenizer, "llama3", markers="brackets", samples=3)


def test_same_marker_ids_but_a_different_vocabulary(llama3_index):
    """Markers agree, one token's id differs: caught on a sampled docid, whole docid shown."""
    spec = json.loads(llama3_index.tokenizer.to_json())
    vocab = spec["model"]["vocab"]
    vocab["ĠHarbor"], vocab["ĠRiver"] = vocab["ĠRiver"], vocab["ĠHarbor"]
    other = Tokenizer.from_str(json.dumps(spec))
    with pytest.raises(InputError, match=r"disagrees: docid '<docid_start>.*Harbor.*<docid_end>' tokenizes to \[128256, .*\] .* vs \[128256, "):
        check_agreement(llama3_index, other, "my/checkpoint")


@pytest.mark.slow
def test_a_model_without_marker_tokens(stage, tmp_path):
    out = tmp_path / "smol"
    build_index(stage, out, tokenizer=SMOL)
    index = Index.open(out)
    model = _off_the_shelf_smol()
    with pytest.raises(InputError) as err:
        check_agreement(index, model, SMOL)
    msg = str(err.value)
    assert "has no <docid_start>/<docid_end> marker tokens" in msg and "grtool train sft" in msg
    assert msg.endswith("use --markers brackets")  # same vocabulary: rebuilding would not help
    check_agreement(index, model, SMOL, markers="brackets")  # brackets need only the vocabulary
    check_agreement(index, load_tokenizer(SMOL).tokenizer, SMOL)  # a trained model's tokenizer: markers at the index's ids


def test_two_tokens_swapped_outside_every_docid_are_found(llama3_index):
    """A swap no sampled docid touches (ids 100000 and 100001: in no docid of the index) passed the sampled check
    and decoded other tokens under the constraint; the whole vocabulary is compared."""
    spec = json.loads(llama3_index.tokenizer.to_json())
    vocab = spec["model"]["vocab"]
    by_id = {i: t for t, i in vocab.items()}
    a, b = by_id[100000], by_id[100001]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    other = Tokenizer.from_str(json.dumps(spec))
    with pytest.raises(InputError, match=rf"token {re.escape(repr(a))} has id 100000 in the index's vocabulary but id 100001 in the model's"):
        check_agreement(llama3_index, other, "my/checkpoint")
    with pytest.raises(InputError, match="has id 100000 in the index's vocabulary"):
        check_agreement(llama3_index, other, "my/checkpoint", markers="brackets")
