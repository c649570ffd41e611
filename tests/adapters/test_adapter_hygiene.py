"""Issue 18: uploads that amplify (zip bombs), JSON nested too deep, and scales that overflow float32."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from loraplex.adapters import AdapterError, AdapterLimits, extract_archive, inspect_adapter, load_adapter
from tests.zip_bomb import write_zip_bomb

MAX_RANK = 8
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
GiB = 1 << 30


def _bytes_written() -> int:
    """Bytes this process has passed to write() so far (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _refused_extraction(archive: Path, dest: Path, code: str, *fragments: str) -> AdapterError:
    with pytest.raises(AdapterError) as info:
        extract_archive(archive, dest, AdapterLimits())
    assert info.value.code == code, str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert not dest.exists() or list(dest.iterdir()) == []
    return info.value


# --- zip bombs --------------------------------------------------------------------------------


def test_zip_bomb_with_a_malformed_header_is_refused_before_its_body_is_written(tmp_path: Path) -> None:
    header = b'{"not": "a tensor table"'  # cut short: not JSON
    head = struct.pack("<Q", len(header)) + header
    size = len(head) + 96 * (1 << 24)  # 1.5 GiB inflated
    bomb = write_zip_bomb(
        tmp_path / "bomb.zip", "adapter_model.safetensors", head, size, {"adapter_config.json": b"{}"}
    )
    assert bomb.stat().st_size < 2 << 20 and size > 1.5 * GiB - (1 << 20)

    before = _bytes_written()
    _refused_extraction(bomb, tmp_path / "dest", "malformed_safetensors", "header is not valid JSON")
    assert _bytes_written() - before < 4 << 20  # not the 1.5 GiB the old extraction wrote


def test_zip_bomb_longer_than_its_header_promises_is_refused_before_its_body_is_written(tmp_path: Path) -> None:
    """A valid header for one small tensor, followed by 1.5 GiB of zeros."""
    header = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    head = struct.pack("<Q", len(header)) + header
    size = len(head) + 96 * (1 << 24)
    bomb = write_zip_bomb(tmp_path / "bomb.zip", "adapter/adapter_model.safetensors", head, size)
    before = _bytes_written()
    _refused_extraction(
        bomb, tmp_path / "dest", "malformed_safetensors", f"header describes {len(head) + 16} bytes", str(size)
    )
    assert _bytes_written() - before < 4 << 20


def test_header_over_its_limit_is_refused_from_the_first_eight_bytes(tmp_path: Path) -> None:
    head = struct.pack("<Q", 1 << 40) + b"{"
    bomb = write_zip_bomb(tmp_path / "bomb.zip", "adapter_model.safetensors", head, len(head) + (1 << 24))
    _refused_extraction(bomb, tmp_path / "dest", "malformed_safetensors", "over the limit of 8388608 bytes")


def test_other_members_share_a_small_budget(tmp_path: Path) -> None:
    bomb = write_zip_bomb(tmp_path / "readme.zip", "adapter/README.md", b"# hi\n", 5 + 3 * (1 << 24))
    before = _bytes_written()
    _refused_extraction(bomb, tmp_path / "dest", "archive_too_large", "max_extra_bytes", "adapter/README.md")
    assert _bytes_written() - before < 4 << 20


def test_pickles_in_an_archive_are_refused_by_name_before_unpacking(tmp_path: Path) -> None:
    archive = tmp_path / "p.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("adapter/adapter_config.json", "{}")
        zf.writestr("adapter/training_args.bin", b"\x80\x04K\x01.")
    _refused_extraction(archive, tmp_path / "dest", "pickled_weights", "adapter/training_args.bin", "never loaded")


# --- JSON nested too deep ---------------------------------------------------------------------


def test_deeply_nested_adapter_config_is_refused_by_its_limit(adapter_dir: Path, base, zip_folder, tmp_path) -> None:
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    text = json.dumps(config)[:-1] + ', "revision": ' + "[" * 10_000 + "]" * 10_000 + "}"
    (adapter_dir / "adapter_config.json").write_text(text)
    for source in (adapter_dir, zip_folder(adapter_dir, tmp_path / "a.zip")):
        for fn in (load_adapter, inspect_adapter):
            with pytest.raises(AdapterError) as info:
                fn(source, base, max_lora_rank=MAX_RANK)
            assert info.value.code == "invalid_config"
            assert "deeper than 64 levels" in str(info.value) and "max_json_depth" in str(info.value)
    with pytest.raises(RecursionError):  # what the limit keeps out: the parse itself fails at this depth
        json.loads(text)


def test_json_depth_limit_is_a_setting(adapter_dir: Path, base) -> None:
    load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK, limits=AdapterLimits(max_json_depth=3))
    with pytest.raises(AdapterError, match="deeper than 1 levels") as info:  # target_modules is a list
        load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK, limits=AdapterLimits(max_json_depth=1))
    assert info.value.code == "invalid_config"


def test_deeply_nested_safetensors_header_is_refused_by_its_limit(adapter_dir: Path, base) -> None:
    path = adapter_dir / "adapter_model.safetensors"
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + length])
    body = json.dumps(header)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}"
    path.write_bytes(struct.pack("<Q", len(body)) + body.encode() + raw[8 + length :])
    with pytest.raises(AdapterError) as info:
        load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    assert info.value.code == "malformed_safetensors" and "deeper than 64 levels" in str(info.value)


# --- scales that overflow float32 -------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, fragments",
    [
        ({"lora_alpha": 1e30}, ["lora_alpha / r = 1e+30 / 4 = 2.5e+29", "bound of 2^32"]),
        ({"lora_alpha": -1e30}, ["lora_alpha / r = -1e+30 / 4", "bound of 2^32"]),
        ({"lora_alpha": 1e30, "use_rslora": True}, ["lora_alpha / sqrt(r) = 1e+30 / sqrt(4) = 5e+29"]),
        ({"alpha_pattern": {"q_proj": 3e12}}, ["layers.0.q_proj", "7.5e+11", "alpha_pattern"]),
    ],
)
def test_scales_over_the_float32_bound_are_refused(adapter_dir: Path, base, edit_config, changes, fragments) -> None:
    edit_config(adapter_dir, **changes)
    for fn in (load_adapter, inspect_adapter):
        with pytest.raises(AdapterError) as info:
            fn(adapter_dir, base, max_lora_rank=MAX_RANK)
        assert info.value.code == "scale_too_large", str(info.value)
        for fragment in fragments:
            assert fragment in str(info.value), str(info.value)


def test_weights_times_scale_over_the_bound_are_refused(adapter_dir: Path, base, edit_tensors) -> None:
    """Each factor is ordinary (scale 2, finite float32 weights), their product is not."""

    def large(t):
        b = t[Q_B].clone()
        b[0, 0] = 1e12
        return {**t, Q_B: b}

    edit_tensors(adapter_dir, large)
    with pytest.raises(AdapterError) as info:
        load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    assert info.value.code == "scale_too_large"
    assert "layers.0.q_proj" in str(info.value) and "max|B| 1e+12" in str(info.value) and "2^32" in str(info.value)


def test_ordinary_scales_and_weights_still_load(adapter_dir: Path, base, edit_config) -> None:
    edit_config(adapter_dir, lora_alpha=64)  # scale 16, a large but real one
    loaded = load_adapter(adapter_dir, base, max_lora_rank=MAX_RANK)
    w = loaded.weights[(0, "q_proj")]
    assert w.scaling == 16.0 and torch.isfinite(w.b).all()
