"""A sharded model folder is verified whole before it loads (issue #46, item 2): transformers loads the tensors the
shard index's weight_map lists, so an index that omits tensors the architecture needs would start them at random
(garbage, exit 0), and one that maps a tensor to a shard without it fails inside the loader. Real sharded copies
of the small model (its own tensors split over two shards), damaged one way each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grtool.errors import InputError

pytestmark = pytest.mark.slow  # the small model's converted folder (converted once per cache)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """The small model re-saved as two safetensors shards and their index, the other files copied."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from grtool.models import resolve_model

    source = Path(resolve_model(None).path)
    folder = tmp_path_factory.mktemp("sharded")
    for f in source.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    tensors = load_file(source / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, folder / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _copy_with_map(sharded: Path, where: Path, edit) -> Path:
    where.mkdir()
    for f in sharded.iterdir():
        (where / f.name).symlink_to(f)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    (where / "model.safetensors.index.json").unlink()
    edit(index["weight_map"])
    (where / "model.safetensors.index.json").write_text(json.dumps(index))
    return where


def test_an_intact_sharded_folder_passes(sharded):
    from grtool.models import _check_model_folder

    _check_model_folder(sharded, "--model")


def test_an_index_that_omits_half_the_tensors_is_refused(sharded, tmp_path, cli):
    from grtool.models import _check_model_folder

    def drop_half(weight_map: dict) -> None:
        for name in sorted(weight_map)[::2]:
            del weight_map[name]

    bad = _copy_with_map(sharded, tmp_path / "half", drop_half)
    with pytest.raises(InputError, match=r"the weights lack \d+ of the \d+ tensors"):
        _check_model_folder(bad, "--model")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}?", "completion": f"Answer {i}."}) + "\n" for i in range(4)))
    proc = cli("train", "sft", data, "--model", bad, "--out", tmp_path / "ckpt", "--dry-run", check=2)
    assert "Traceback" not in proc.stderr and "the weights lack" in proc.stderr, proc.stderr


def test_an_index_mapping_a_tensor_to_a_shard_without_it_is_refused(sharded, tmp_path):
    from grtool.models import _check_model_folder

    def misroute(weight_map: dict) -> None:
        name = sorted(weight_map)[0]
        weight_map[name] = next(s for s in sorted(set(weight_map.values())) if s != weight_map[name])

    bad = _copy_with_map(sharded, tmp_path / "misrouted", misroute)
    with pytest.raises(InputError, match="maps tensor .* which does not hold it"):
        _check_model_folder(bad, "--model")
