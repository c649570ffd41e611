"""Archives (.zip, .tar.gz, .tgz; flat or in one folder) and a content hash that ignores packaging."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from loraplex.adapters import AdapterLimits, BaseModelSpec, extract_archive, load_adapter

MAX_RANK = 8


@pytest.mark.parametrize("inside", [None, "my-adapter"])
@pytest.mark.parametrize("suffix", [".zip", ".tar.gz", ".tgz"])
def test_archives_load_like_the_folder(adapter_dir, base, tmp_path, zip_folder, tar_folder, suffix, inside) -> None:
    archive = tmp_path / f"upload{suffix}"
    (zip_folder if suffix == ".zip" else tar_folder)(adapter_dir, archive, inside=inside)
    from_archive = load_adapter(archive, base, max_lora_rank=MAX_RANK)
    from_folder = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    assert from_archive.content_hash == from_folder.content_hash
    assert from_archive.weights.keys() == from_folder.weights.keys()
    for key, w in from_folder.weights.items():
        torch.testing.assert_close(from_archive.weights[key].a, w.a, rtol=0, atol=0)
        torch.testing.assert_close(from_archive.weights[key].b, w.b, rtol=0, atol=0)


def test_archive_kind_is_sniffed_when_the_name_has_no_suffix(adapter_dir, base, tmp_path, zip_folder) -> None:
    archive = zip_folder(adapter_dir, tmp_path / "blob-0001")
    assert (
        load_adapter(archive, base, max_lora_rank=MAX_RANK).content_hash
        == load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK).content_hash
    )


def test_extract_archive_returns_the_adapter_folder(adapter_dir, tmp_path, zip_folder) -> None:
    archive = zip_folder(adapter_dir, tmp_path / "a.zip", inside="nested")
    root = extract_archive(archive, tmp_path / "out", AdapterLimits())
    assert root == tmp_path / "out" / "nested"
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in adapter_dir.iterdir())


def test_hash_ignores_file_order_config_spelling_and_extra_files(adapter_dir, base, tmp_path, zip_folder) -> None:
    reference = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK).content_hash
    other = tmp_path / "respelled"
    shutil.copytree(adapter_dir, other)
    tensors = load_file(other / "adapter_model.safetensors")
    # Tensors in reverse order inside the file, metadata changed.
    reordered = dict(reversed(list(tensors.items())))
    (other / "adapter_model.safetensors").write_bytes(save(reordered, metadata={"note": "x"}))
    config = json.loads((other / "adapter_config.json").read_text())
    config = dict(reversed(list(config.items())))
    config.update(peft_version="0.99", base_model_name_or_path="somewhere/else", target_modules="all-linear")
    (other / "adapter_config.json").write_text(json.dumps(config))
    (other / "README.md").write_text("different readme")
    assert load_adapter(other, base, max_lora_rank=MAX_RANK).content_hash == reference
    archive = zip_folder(other, tmp_path / "re.zip", reverse=True)
    assert load_adapter(archive, base, max_lora_rank=MAX_RANK).content_hash == reference


def test_hash_changes_with_weights_or_scaling(adapter_dir, base, tmp_path, edit_config, edit_tensors) -> None:
    reference = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK).content_hash

    def variant(name: str) -> Path:
        return Path(shutil.copytree(adapter_dir, tmp_path / name))

    alpha = variant("alpha")
    edit_config(alpha, lora_alpha=9)
    rslora = variant("rslora")
    edit_config(rslora, use_rslora=True)
    weight = variant("weight")
    key = "base_model.model.model.layers.2.mlp.up_proj.lora_B.weight"
    edit_tensors(weight, lambda t: {**t, key: t[key] + 1e-3})
    as_half = variant("half")
    edit_tensors(as_half, lambda t: {k: v.half() for k, v in t.items()})
    hashes = {load_adapter(p, base, max_lora_rank=MAX_RANK).content_hash for p in (alpha, rslora, weight, as_half)}
    assert reference not in hashes and len(hashes) == 4


def test_different_seeds_give_different_hashes(make_adapter, base: BaseModelSpec) -> None:
    a, _ = make_adapter("a", seed=1)
    b, _ = make_adapter("b", seed=2)
    assert (
        load_adapter(a, base, max_lora_rank=MAX_RANK).content_hash
        != load_adapter(b, base, max_lora_rank=MAX_RANK).content_hash
    )
